"""Host evaluation of a detector: decode with the priors, per-class NMS, COCO mAP by pycocotools.

The inference model gives class probabilities ``[N, P, C + 1]`` (background at 0) and box offsets
``[N, P, 4]``; :func:`device_agent.detection.postprocess` - the numpy helper a board application
imports - decodes them with the priors and keeps the best boxes per class, so the host scores
exactly what the board would report. The test set holds the ground truth (``gt_boxes`` ``[N, M, 4]``
corners in [0, 1], ``gt_labels`` ``[N, M]`` with -1 padding, written by
:func:`tasks.detection.annotations.detection_arrays`).

The mAP itself is pycocotools' ``COCOeval`` (the reference implementation every detection paper
reports with; chosen over faster-coco-eval for being the reference and numpy-only): mAP@[.5:.95]
(``map``), mAP@0.5 (``map50``), mAP@0.75 (``map75``), per-class AP at 0.5 and over .5:.95, and
the precision-recall curve of each class at IoU 0.5 for the report.
"""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path
from typing import Any

import numpy as np

from device_agent import detection as det
from device_agent.teacher.boxes import detections
from tasks.errors import EvaluationError
from tasks.judge.coco_resample import match_records, no_detection_records
from tasks.judge.runtime import npz_arrays, session
from tasks.prepare.validation.teacher import teacher_outputs, wire_teacher
from tasks.recipe.extras import DetectionSpec

EXAMPLES = 4  # test images whose detections the metrics keep for the report's drawings
EXAMPLE_SCORE = 0.1  # drawn detections: at least this score
EXAMPLE_BOXES = 6  # and at most this many per image (the best)
GT_HINT = "tasks.detection.annotations.detection_arrays writes them beside x and the per-prior targets"


def run_detector(
    model_onnx: Path, x: np.ndarray, spec: DetectionSpec, batch_size: int = 32
) -> tuple[np.ndarray, np.ndarray, float]:
    """Scores ``[N, P, C + 1]``, offsets ``[N, P, 4]`` and the seconds spent in ``run``."""
    sess = session(model_onnx)
    outputs = [o.name for o in sess.get_outputs()]
    for field, name in (("scores_output", spec.scores_output), ("offsets_output", spec.offsets_output)):
        if name not in outputs:
            raise EvaluationError(
                f"detection.{field}: model {model_onnx} has no output {name!r} (it has {outputs})"
            )
    inp = sess.get_inputs()[0].name
    scores, offsets, spent = [], [], 0.0
    for start in range(0, len(x), batch_size):
        t0 = time.perf_counter()
        s, o = sess.run([spec.scores_output, spec.offsets_output], {inp: x[start : start + batch_size]})
        spent += time.perf_counter() - t0
        scores.append(s)
        offsets.append(o)
    return np.concatenate(scores), np.concatenate(offsets), spent


def check_outputs(scores: np.ndarray, offsets: np.ndarray, priors: np.ndarray, spec: DetectionSpec) -> None:
    """Shapes the decoding relies on, each mismatch named."""
    classes = len(spec.classes) + 1
    if scores.ndim != 3 or scores.shape[2] != classes:
        raise EvaluationError(
            f"detection.scores_output: expected [N, P, {classes}] (background + {len(spec.classes)} "
            f"classes), got {list(scores.shape)}"
        )
    if offsets.shape != (*scores.shape[:2], 4):
        raise EvaluationError(
            f"detection.offsets_output: expected [N, {scores.shape[1]}, 4], got {list(offsets.shape)}"
        )
    if len(priors) != scores.shape[1]:
        raise EvaluationError(f"detection priors: {len(priors)} priors for a model with {scores.shape[1]}")


PROBABILITY_TOL = 1e-3  # softmax rows of float32 sum to 1 within this


def class_probabilities(scores: np.ndarray, spec: DetectionSpec) -> np.ndarray:
    """The detector's scores as class probabilities, checked before any precision or recall point
    depends on them: ``scores = "logits"`` applies a softmax over the classes; probabilities must
    lie in [0, 1] with each prior's row summing to 1, or the evaluation stops with one line."""
    s = scores.astype(np.float64)
    low, high = float(s.min(initial=0.0)), float(s.max(initial=0.0))
    sums = s.sum(axis=-1)
    looks_like = (
        low >= -PROBABILITY_TOL
        and high <= 1 + PROBABILITY_TOL
        and bool((np.abs(sums - 1) <= PROBABILITY_TOL * s.shape[-1]).all())
    )
    name = f"detection.scores_output {spec.scores_output!r}"
    if spec.scores == "logits":
        if looks_like and s.size:
            raise EvaluationError(
                f"{name}: detection.scores = 'logits', but every row already lies in [0, 1] and sums to 1 "
                '(probabilities: a second softmax would flatten them); set scores = "probabilities"'
            )
        shifted = s - s.max(axis=-1, keepdims=True)
        e = np.exp(shifted)
        return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
    if not looks_like:
        raise EvaluationError(
            f"{name}: expected class probabilities (in [0, 1], each row summing to 1), got values in "
            f"[{low:.3g}, {high:.3g}] with row sums in [{float(sums.min()):.3g}, {float(sums.max()):.3g}]: "
            'logits? set [detection] scores = "logits" and the host applies a softmax'
        )
    return scores


def coco_eval(
    detections: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    gt_boxes: np.ndarray,
    gt_labels: np.ndarray,
    classes: tuple[str, ...],
    size: tuple[int, int],
    max_detections: int = 100,
) -> dict[str, Any]:
    """COCO box metrics of per-image ``(boxes, labels, scores)`` against the ground truth.

    Boxes are corners in [0, 1]; they are scaled to ``size`` (width, height) pixels so COCO's
    area ranges mean what they usually do. Classes without a ground-truth box get ``None`` AP.
    """
    from pycocotools.coco import COCO  # pycocotools only for a detector's mAP
    from pycocotools.cocoeval import COCOeval  # pycocotools only for a detector's mAP

    width, height = size
    scale = np.asarray([width, height, width, height], np.float64)

    def xywh(box: np.ndarray) -> list[float]:
        x1, y1, x2, y2 = (box * scale).tolist()
        return [x1, y1, x2 - x1, y2 - y1]

    annotations = []
    for i, (boxes, labels) in enumerate(zip(gt_boxes, gt_labels, strict=True)):
        for box, label in zip(boxes[labels >= 0], labels[labels >= 0], strict=True):
            b = xywh(box)
            annotations.append(
                {"id": len(annotations) + 1, "image_id": i, "category_id": int(label) + 1, "bbox": b,
                 "area": b[2] * b[3], "iscrowd": 0}
            )  # fmt: skip
    results = [
        {"image_id": i, "category_id": int(label) + 1, "bbox": xywh(box), "score": float(score)}
        for i, (boxes, labels, scores) in enumerate(detections)
        for box, label, score in zip(boxes, labels, scores, strict=True)
    ]
    empty = {"map": 0.0, "map50": 0.0, "map75": 0.0}
    per_class_none: dict[str, float | None] = {c: None for c in classes}
    if not annotations:
        raise EvaluationError("detection test set: no ground-truth boxes (gt_labels are all -1)")
    gt = COCO()
    gt.dataset = {
        "images": [{"id": i, "width": width, "height": height} for i in range(len(gt_boxes))],
        "annotations": annotations,
        "categories": [{"id": k + 1, "name": name} for k, name in enumerate(classes)],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        if not results:  # pycocotools cannot load an empty result list: nothing detected, AP 0
            seen = {a["category_id"] - 1 for a in annotations}
            zeros = {c: (0.0 if k in seen else None) for k, c in enumerate(classes)}
            recall = np.linspace(0, 1, 101).round(2).tolist()
            counts = np.stack([(gt_labels == k).sum(axis=1) for k in range(len(classes))])
            matches = no_detection_records(counts, np.linspace(0.5, 0.95, 10).round(2).tolist())
            return {**empty, "per_class_ap50": zeros, "per_class_ap": dict(zeros),
                    "pr50": {"recall": recall, **{c: [0.0] * 101 for c, v in zeros.items() if v is not None}},
                    "detections": 0, "matches": matches}  # fmt: skip
        dt = gt.loadRes(results)
        ev = COCOeval(gt, dt, "bbox")
        ev.params.maxDets = [1, 10, max_detections]
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    precision = ev.eval["precision"]  # [IoU thresholds, recall points, classes, areas, max dets]
    per_ap50: dict[str, float | None] = dict(per_class_none)
    per_ap: dict[str, float | None] = dict(per_class_none)
    pr50: dict[str, list[float]] = {"recall": [round(float(r), 2) for r in ev.params.recThrs]}
    for k, name in enumerate(classes):
        at50 = precision[0, :, k, 0, -1]
        if (at50 < 0).all():  # no ground truth of this class
            continue
        every = precision[:, :, k, 0, -1]
        per_ap50[name] = round(float(at50[at50 > -1].mean()), 6)
        per_ap[name] = round(float(every[every > -1].mean()), 6)
        pr50[name] = [round(float(p), 4) for p in np.maximum(at50, 0)]
    # from the precision array at the last maxDets (= max_detections), not ev.stats: summarize()
    # reads mAP@[.5:.95] at maxDets == 100 only and gives -1 for any other max_detections
    last = precision[:, :, :, 0, -1]
    iou = np.asarray(ev.params.iouThrs)

    def mean_ap(p: np.ndarray) -> float:
        return round(float(p[p > -1].mean()), 6) if (p > -1).any() else 0.0

    return {
        "map": mean_ap(last),
        "map50": mean_ap(last[np.isclose(iou, 0.5)]),
        "map75": mean_ap(last[np.isclose(iou, 0.75)]),
        "per_class_ap50": per_ap50,
        "per_class_ap": per_ap,
        "pr50": pr50,
        "detections": len(results),
        "matches": match_records(ev),  # per-image outcomes: the gate's bootstrap over images
    }


def detection_metrics(
    model_onnx: Path, test_npz: Path, spec: DetectionSpec, priors_npy: Path
) -> tuple[dict[str, Any], float, int]:
    """COCO metrics of ``model_onnx`` on the test set, examples for the report, seconds in ``run``
    and the number of images."""
    arrays = npz_arrays(Path(test_npz), ["x", "gt_boxes", "gt_labels"]) if _has_gt(test_npz) else None
    if arrays is None:
        raise EvaluationError(
            f"test set {test_npz}: a detection test set needs arrays gt_boxes and gt_labels ({GT_HINT})"
        )
    x = np.asarray(arrays["x"], np.float32)
    gt_boxes, gt_labels = arrays["gt_boxes"], arrays["gt_labels"]
    if gt_boxes.shape[:1] != (len(x),) or gt_boxes.shape[2:] != (4,) or gt_labels.shape != gt_boxes.shape[:2]:
        raise EvaluationError(
            f"test set {test_npz}: expected gt_boxes [N, M, 4] and gt_labels [N, M] for N = {len(x)} "
            f"images, got {list(gt_boxes.shape)} / {list(gt_labels.shape)}"
        )
    if gt_labels.max(initial=-1) >= len(spec.classes):
        raise EvaluationError(
            f"test set {test_npz}: gt_labels has class {int(gt_labels.max())}; detection.classes has "
            f"{len(spec.classes)} ({list(spec.classes)})"
        )
    priors = np.load(priors_npy)
    scores, offsets, spent = run_detector(model_onnx, x, spec)
    check_outputs(scores, offsets, priors, spec)
    scores = class_probabilities(scores, spec)
    found = det.postprocess(
        scores, offsets, priors, score_threshold=spec.score_threshold,
        iou_threshold=spec.iou_threshold, top_k=spec.max_detections,
    )  # fmt: skip
    metrics = coco_eval(
        found, gt_boxes, gt_labels, spec.classes, (x.shape[-1], x.shape[-2]), spec.max_detections
    )
    metrics["classes"] = list(spec.classes)
    metrics["examples"] = [
        {
            "index": i,
            "boxes": np.round(b[keep], 4).tolist(),
            "labels": lab[keep].tolist(),
            "scores": np.round(s[keep], 4).tolist(),
        }
        for i, (b, lab, s) in enumerate(found[:EXAMPLES])
        for keep in [np.flatnonzero(s >= EXAMPLE_SCORE)[:EXAMPLE_BOXES]]
    ]
    return metrics, spent, len(x)


def _has_gt(test_npz: Path) -> bool:
    path = Path(test_npz)
    if not path.is_file():
        return True  # npz_arrays names the missing file
    with np.load(path) as data:
        return {"gt_boxes", "gt_labels"} <= set(data.files)


def teacher_box_metrics(model_onnx: Path, test_npz: Path, recipe: Any) -> dict[str, Any]:
    """COCO metrics of a detector teacher (class scores and corner boxes outputs) on the test set,
    its detections made by the board's code (:func:`device_agent.teacher.boxes.detections`)."""
    spec, t = recipe.detection, recipe.teacher
    arrays = npz_arrays(Path(test_npz), ["x", "gt_boxes", "gt_labels"])
    x = np.asarray(arrays["x"], np.float32)
    scores, boxes = teacher_outputs(Path(model_onnx), x, t.output, (t.boxes_output,))
    found = detections(scores, boxes, wire_teacher(recipe))
    per_image = [
        (found["boxes"][i][keep], found["labels"][i][keep], found["scores"][i][keep])
        for i in range(len(x))
        for keep in [found["labels"][i] >= 0]
    ]
    metrics = coco_eval(per_image, arrays["gt_boxes"], arrays["gt_labels"], spec.classes,
                        (x.shape[-1], x.shape[-2]), spec.max_detections)  # fmt: skip
    return {**metrics, "classes": list(spec.classes)}
