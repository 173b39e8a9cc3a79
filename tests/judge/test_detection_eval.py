"""Host evaluation of detectors: COCO mAP by pycocotools on known cases, and the errors a detection
test set or a detector's outputs can raise."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import EvaluationError
from tasks.judge.detection import check_outputs, coco_eval
from tasks.recipe.extras import DetectionSpec

CLASSES = ("square", "disc", "triangle")
GT_BOXES = np.array(
    [[[0.1, 0.1, 0.4, 0.4], [0.5, 0.5, 0.9, 0.9]], [[0.2, 0.3, 0.6, 0.7], [0, 0, 0, 0]]], np.float32
)
GT_LABELS = np.array([[0, 1], [0, -1]], np.int64)


def _dets(boxes_per_image, labels_per_image, scores_per_image=None):
    out = []
    for i, (b, lab) in enumerate(zip(boxes_per_image, labels_per_image, strict=True)):
        s = np.ones(len(lab), np.float32) if scores_per_image is None else np.asarray(scores_per_image[i])
        out.append((np.asarray(b, np.float32).reshape(-1, 4), np.asarray(lab, np.int64), s))
    return out


def test_perfect_detections_score_one_and_absent_classes_none():
    found = _dets([GT_BOXES[0], GT_BOXES[1][:1]], [[0, 1], [0]])
    m = coco_eval(found, GT_BOXES, GT_LABELS, CLASSES, (96, 96))
    assert m["map50"] == pytest.approx(1.0) and m["map"] == pytest.approx(1.0)
    assert m["per_class_ap50"] == {"square": 1.0, "disc": 1.0, "triangle": None}
    assert set(m["pr50"]) == {"recall", "square", "disc"} and len(m["pr50"]["recall"]) == 101


def test_a_loose_box_counts_at_iou_half_not_at_stricter_thresholds():
    loose = GT_BOXES.copy()
    loose[:, :, 2:] += 0.1  # IoU with the truth 0.56-0.64
    found = _dets([loose[0], loose[1][:1]], [[0, 1], [0]])
    m = coco_eval(found, GT_BOXES, GT_LABELS, CLASSES, (96, 96))
    assert m["map50"] == pytest.approx(1.0)
    assert 0.0 < m["map"] < 0.7 and m["map75"] == pytest.approx(0.0)


def test_wrong_class_and_ranking_lower_ap():
    wrong = coco_eval(
        _dets([GT_BOXES[0], GT_BOXES[1][:1]], [[2, 2], [2]]), GT_BOXES, GT_LABELS, CLASSES, (96, 96)
    )
    assert wrong["map50"] == 0.0 and wrong["per_class_ap50"]["square"] == 0.0
    # a confident false positive ranked above the true square halves the square's precision there
    boxes = [np.vstack([[0.6, 0.0, 0.9, 0.3], GT_BOXES[0]]), GT_BOXES[1][:1]]
    found = _dets(boxes, [[0, 0, 1], [0]], [[0.9, 0.8, 0.8], [0.7]])
    m = coco_eval(found, GT_BOXES, GT_LABELS, CLASSES, (96, 96))
    assert 0.5 < m["per_class_ap50"]["square"] < 1.0 and m["per_class_ap50"]["disc"] == pytest.approx(1.0)


def test_nothing_detected_is_zero_not_an_error():
    m = coco_eval(_dets([[], []], [[], []]), GT_BOXES, GT_LABELS, CLASSES, (96, 96))
    assert m["map50"] == m["map"] == 0.0 and m["detections"] == 0
    assert m["per_class_ap50"]["triangle"] is None and m["per_class_ap50"]["square"] == 0.0


def test_a_test_set_without_boxes_is_refused():
    with pytest.raises(EvaluationError, match="no ground-truth boxes"):
        coco_eval(_dets([[]], [[]]), GT_BOXES[:1], np.full((1, 2), -1), CLASSES, (96, 96))


def test_output_shapes_are_checked_against_classes_and_priors():
    spec = DetectionSpec(classes=CLASSES)
    priors = np.zeros((10, 4), np.float32)
    check_outputs(np.zeros((2, 10, 4)), np.zeros((2, 10, 4)), priors, spec)
    with pytest.raises(EvaluationError, match="scores_output.*background \\+ 3 classes"):
        check_outputs(np.zeros((2, 10, 3)), np.zeros((2, 10, 4)), priors, spec)
    with pytest.raises(EvaluationError, match="offsets_output"):
        check_outputs(np.zeros((2, 10, 4)), np.zeros((2, 10, 2)), priors, spec)
    with pytest.raises(EvaluationError, match="9 priors for a model with 10"):
        check_outputs(np.zeros((2, 10, 4)), np.zeros((2, 10, 4)), priors[:9], spec)


def test_a_detection_test_set_needs_its_ground_truth(tmp_path):
    from tasks.judge.detection import detection_metrics

    np.savez(tmp_path / "t.npz", x=np.zeros((2, 3, 8, 8), np.float32), y=np.zeros((2, 4), np.int64))
    with pytest.raises(EvaluationError, match="gt_boxes and gt_labels.*detection_arrays"):
        detection_metrics(tmp_path / "m.onnx", tmp_path / "t.npz", DetectionSpec(CLASSES), tmp_path / "p.npy")
    np.savez(
        tmp_path / "t.npz",
        x=np.zeros((2, 3, 8, 8), np.float32),
        gt_boxes=np.zeros((2, 1, 4), np.float32),
        gt_labels=np.full((2, 1), 5),
    )
    with pytest.raises(EvaluationError, match="gt_labels has class 5"):
        detection_metrics(tmp_path / "m.onnx", tmp_path / "t.npz", DetectionSpec(CLASSES), tmp_path / "p.npy")


def test_scores_are_checked_as_probabilities_and_logits_converted_or_refused():
    """The ST detector's case: its ``confs`` output is raw logits, which the host took as probabilities."""
    from tasks.judge.detection import class_probabilities

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (2, 10, 4)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    spec = DetectionSpec(classes=CLASSES, scores_output="confs")
    assert class_probabilities(probs, spec) is probs  # probabilities pass unchanged
    with pytest.raises(EvaluationError, match=r"detection.scores_output 'confs': expected class probabilities.*"
                                              r'set \[detection\] scores = "logits"'):  # fmt: skip
        class_probabilities(logits, spec)
    # values in [0, 1] whose rows do not sum to 1 (independent sigmoids) are not softmax probabilities
    with pytest.raises(EvaluationError, match="row sums in"):
        class_probabilities(1 / (1 + np.exp(-logits)), spec)
    as_logits = DetectionSpec(classes=CLASSES, scores_output="confs", scores="logits")
    np.testing.assert_allclose(class_probabilities(logits, as_logits), probs, rtol=1e-5, atol=1e-7)
    with pytest.raises(EvaluationError, match="a second softmax would flatten them"):
        class_probabilities(probs, as_logits)
