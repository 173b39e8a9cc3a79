"""A detector teacher's outputs become detections on the board (issue 26): properties of
:func:`device_agent.teacher.boxes.detections` over generated outputs, and the match to the student's
priors giving back the boxes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from device_agent import detection as det
from device_agent.protocol import BlobRef, TeacherSpec
from device_agent.teacher.boxes import detections


def _spec(**kw) -> TeacherSpec:
    base = {
        "labels": "boxes",
        "boxes_output": "boxes",
        "priors": BlobRef("0" * 64, 0),
        "scores": "probabilities",
    }
    return TeacherSpec(BlobRef("0" * 64, 0), **{**base, **kw})


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 3), k=st.integers(1, 30), classes=st.integers(1, 4), seed=st.integers(0, 2**16),
    iou=st.floats(0.1, 0.9), max_boxes=st.integers(1, 10), logits=st.booleans(),
)  # fmt: skip
def test_detections_are_nms_kept_sorted_and_padded(n, k, classes, seed, iou, max_boxes, logits):
    rng = np.random.default_rng(seed)
    raw = rng.normal(0, 2, (n, k, classes + 1)).astype(np.float32)
    probs = np.exp(raw) / np.exp(raw).sum(-1, keepdims=True)
    corner = np.sort(rng.uniform(-0.1, 1.1, (n, k, 2, 2)), axis=2).transpose(0, 1, 3, 2).reshape(n, k, 4)
    corner = corner[..., [0, 2, 1, 3]].astype(np.float32)  # x1, y1, x2, y2 with x1 <= x2, y1 <= y2
    spec = _spec(iou_threshold=iou, max_boxes=max_boxes, scores="logits" if logits else "probabilities")
    got = detections(raw if logits else probs, corner, spec)
    assert got["boxes"].shape == (n, max_boxes, 4) and got["labels"].shape == got["scores"].shape == (
        n,
        max_boxes,
    )
    for i in range(n):
        valid = got["labels"][i] >= 0
        m = int(valid.sum())
        assert valid[:m].all() and not valid[m:].any()  # real detections first, then padding
        s, lab, b = got["scores"][i][:m], got["labels"][i][:m], got["boxes"][i][:m]
        assert (np.diff(s) <= 1e-7).all() and (s > 0.01).all() and (lab < classes).all()
        assert ((b >= 0) & (b <= 1)).all()
        for c in np.unique(lab):  # within a class, no two kept boxes overlap more than the NMS IoU
            same = b[lab == c]
            overlaps = det.iou(same, same) - np.eye(len(same))
            assert (overlaps <= iou + 1e-5).all()
        np.testing.assert_allclose(s, [probs[i, np.argmin(np.abs(probs[i, :, c + 1] - v)), c + 1]
                                       for v, c in zip(s, lab, strict=True)], atol=1e-5)  # fmt: skip


def test_matched_detections_decode_back_to_the_boxes():
    """The targets built from the teacher's boxes point the matched priors at those boxes."""
    priors = det.priors([det.FeatureSpec(6, 20, 40), det.FeatureSpec(3, 40, 70)], 96)
    boxes = np.array([[0.1, 0.1, 0.4, 0.45], [0.5, 0.55, 0.9, 0.95]], np.float32)
    scores = np.zeros((1, 2, 4), np.float32)
    scores[0, 0, [0, 2]] = [0.1, 0.9]  # class 1 (disc) at 0.9
    scores[0, 1, [0, 3]] = [0.2, 0.8]  # class 2 (triangle) at 0.8
    got = detections(scores, boxes[None], _spec(threshold=0.5))
    keep = got["labels"][0] >= 0
    classes, offsets = det.match(got["boxes"][0][keep], got["labels"][0][keep], priors, 0.5)
    decoded = det.decode(offsets, priors)
    for box, label in zip(boxes, (1, 2), strict=True):
        hit = classes == label + 1
        assert hit.any()
        np.testing.assert_allclose(decoded[hit], np.repeat(box[None], hit.sum(), 0), atol=1e-4)
