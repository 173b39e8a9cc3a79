"""The training accuracy the agent reports with each epoch: correct predictions of a batch per
task (classification and binary: samples; segmentation: each image's pixel accuracy; keypoints:
each image's PCK), summed so that ``correct / seen`` is their mean, and summed over several pending
batches in a few numpy calls (:mod:`device_agent.job.trainer` counts them between ONNX Runtime
steps)."""

from __future__ import annotations

import numpy as np

from device_agent.keypoints import image_pck
from device_agent.keypoints_spec import KeypointsScoring


def correct_of(task: str, logits: np.ndarray, labels: np.ndarray, ignore: int | None = None,
                input_hw: tuple = (), scoring: KeypointsScoring | None = None) -> float:  # fmt: skip
    """Correct predictions of one batch: argmax = label (classification), sign = label (binary);
    segmentation: each image's pixel accuracy (argmax over axis 1 = label, ignored pixels left out),
    keypoints: each image's PCK (``input_hw``: the input's pixels; ``scoring``: the recipe's
    threshold and decoding), summed, so that ``correct / seen`` is their mean over the images."""
    if task == "keypoints":
        scoring = scoring or KeypointsScoring()
        return float(image_pck(logits, labels, input_hw, scoring.pck_threshold, scoring.subpixel).sum())
    if task == "segmentation":
        kept = labels != ignore if ignore is not None else np.ones(labels.shape, bool)
        hits = ((logits.argmax(axis=1) == labels) & kept).reshape(len(labels), -1).sum(axis=1)
        return float((hits / np.maximum(kept.reshape(len(labels), -1).sum(axis=1), 1)).sum())
    if task == "classification":
        top = labels.argmax(axis=-1) if labels.ndim == logits.ndim == 2 else labels  # soft labels: top class
        return int((logits.argmax(axis=-1) == top.reshape(-1)).sum())
    return int(((logits.reshape(-1) > 0) == (labels.reshape(-1) > 0.5)).sum())


def count_correct(task: str, pending: list[tuple[np.ndarray, np.ndarray]], ignore: int | None = None,
                   input_hw: tuple = (), scoring: KeypointsScoring | None = None) -> float:  # fmt: skip
    """``correct_of`` summed over several batches, in a few numpy calls when their shapes allow."""
    if task in ("segmentation", "keypoints"):
        return sum(correct_of(task, lg, lb, ignore, input_hw, scoring) for lg, lb in pending)
    logits = [lg for lg, _ in pending]
    if task == "classification" and all(lb.ndim == 2 for _, lb in pending):  # soft labels: their top class
        pending = [(lg, lb.argmax(axis=-1)) for lg, lb in pending]
    labels = np.concatenate([lb for _, lb in pending], axis=None)
    if task == "binary":
        return int(((np.concatenate(logits, axis=None) > 0) == (labels > 0.5)).sum())
    if all(lg.ndim == 2 for lg in logits):
        return int((np.concatenate(logits).argmax(axis=-1) == labels).sum())
    return sum(correct_of(task, lg, lb) for lg, lb in pending)
