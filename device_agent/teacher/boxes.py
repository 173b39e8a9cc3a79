"""A detector teacher on the board (``teacher.labels = "boxes"``): its detections become the student
detector's per-prior targets, by the agent's own box code (:mod:`device_agent.detection`).

Stored per shard (beside it, as for class labels): each image's detections after per-class NMS,
best first, ``max_boxes`` at most (``boxes [n, M, 4]``, ``labels [n, M]`` with -1 for none,
``scores [n, M]``). When the dataset opens, the detections scoring at least ``threshold`` are
matched to the student's priors (:func:`device_agent.detection.match`) into the classes and offsets
the student's loss reads; an image left without a detection is not trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from device_agent import detection as det
from device_agent.data.readers import NpzDataset, load_npz_arrays
from device_agent.errors import AgentError
from device_agent.protocol import ExitCode, TeacherSpec
from device_agent.teacher.labels import (
    HIST_BINS,
    LabeledShard,
    RowView,
    TeacherData,
    has_array,
    label_shards,
    labels_file,
)

FLOOR = 0.01  # detections below this score are not stored


def detections(scores: np.ndarray, boxes: np.ndarray, teacher: TeacherSpec) -> dict[str, np.ndarray]:
    """Per image of a batch: the teacher's detections after per-class NMS, best first, padded."""
    scores, boxes = np.asarray(scores, np.float32), np.asarray(boxes, np.float32)
    if scores.ndim != 3 or boxes.shape != (*scores.shape[:2], 4):
        raise AgentError(ExitCode.DATA_MISMATCH, f"teacher.output: expected scores [N, K, C + 1] and boxes [N, K, 4], "
                         f"got {list(scores.shape)} and {list(boxes.shape)}", "teacher.output")  # fmt: skip
    if teacher.scores == "logits":
        z = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores = z / z.sum(axis=-1, keepdims=True)
    m = teacher.max_boxes
    out = {"boxes": np.zeros((len(scores), m, 4), np.float32), "labels": np.full((len(scores), m), -1, np.int64),
           "scores": np.zeros((len(scores), m), np.float32)}  # fmt: skip
    for i, (s, b) in enumerate(zip(scores, np.clip(boxes, 0.0, 1.0), strict=True)):
        found = []
        for cls in range(1, s.shape[1]):
            idx = np.flatnonzero(s[:, cls] > FLOOR)
            if len(idx):
                keep = idx[det.nms(b[idx], s[idx, cls], teacher.iou_threshold, m)]
                found += [(float(s[k, cls]), cls - 1, k) for k in keep]
        found.sort(key=lambda f: -f[0])
        for j, (score, label, k) in enumerate(found[:m]):
            out["boxes"][i, j], out["labels"][i, j], out["scores"][i, j] = b[k], label, score
    return out


def box_shards(model: Path, teacher: TeacherSpec, folder: Path, paths: list[Path], names: list[str],
               feeds: dict[str, str], priors_path: Path, events: Any, field_name: str) -> TeacherData:  # fmt: skip
    """Label the unlabeled shards with the detector teacher (or reuse stored detections) and open
    every shard: matched targets for those, the shard's own targets for the others."""
    mapping = feeds or dict(zip(names, ("x", "y", "offsets"), strict=False))
    by_key = {k: n for n, k in mapping.items() if n in names}
    if teacher.target not in by_key or teacher.offsets_target not in by_key:
        raise AgentError(ExitCode.INVALID_SPEC, f"teacher.target: no model inputs fed from {teacher.target!r} and "
                         f"{teacher.offsets_target!r} (feeds: {mapping})", "teacher.target")  # fmt: skip
    priors = np.load(priors_path, allow_pickle=False).astype(np.float32)
    unlabeled = [p for p in paths if not has_array(p, teacher.target)]
    figures = label_shards(model, teacher, folder, unlabeled, events,
                           digest=lambda outs, t: detections(outs[0], outs[1], t))  # fmt: skip
    stored = {p.name: load_npz_arrays(labels_file(folder, teacher, p), "teacher labels") for p in unlabeled}
    all_scores, kept_boxes, classes, images, kept_images = [], 0, np.zeros(0, np.int64), 0, 0
    shards: list[Any] = []
    for p in paths:
        where = f"{field_name} ({p.name})"
        if p.name not in stored:
            shards.append(NpzDataset(p, names, feeds, where))
            continue
        got = stored[p.name]
        confident = (got["labels"] >= 0) & (got["scores"] >= teacher.threshold)
        rows = np.flatnonzero(confident.any(axis=1))
        all_scores.append(got["scores"][got["labels"] >= 0])
        images, kept_images, kept_boxes = (
            images + len(confident),
            kept_images + len(rows),
            kept_boxes + int(confident.sum()),
        )
        classes = np.concatenate([classes, got["labels"][confident]])
        targets = [det.match(got["boxes"][r][confident[r]], got["labels"][r][confident[r]], priors, teacher.match_iou)
                   for r in rows]  # fmt: skip
        if not len(rows):
            continue
        arrays = {n: RowView(load_npz_arrays(p, where)[mapping[n]], rows) for n in names
                  if mapping[n] not in (teacher.target, teacher.offsets_target)}  # fmt: skip
        arrays[by_key[teacher.target]] = np.stack([t[0] for t in targets])
        arrays[by_key[teacher.offsets_target]] = np.stack([t[1] for t in targets]).astype(np.float32)
        shards.append(LabeledShard(arrays, where))
    if not shards:
        raise AgentError(ExitCode.DATA_MISMATCH, f"{field_name}: the teacher found no box scoring {teacher.threshold} "
                         "or more: nothing to train on", "teacher.threshold")  # fmt: skip
    scores = np.concatenate(all_scores) if all_scores else np.zeros(0)
    hist, _ = np.histogram(scores, bins=HIST_BINS, range=(0.0, 1.0))
    figures.update(
        unlabeled_shards=len(unlabeled), labeled_shards=len(paths) - len(unlabeled), threshold=teacher.threshold,
        teacher_samples=images, kept=kept_images, dropped_threshold=images - kept_images, dropped_cap=0,
        boxes=kept_boxes, boxes_per_image=round(kept_boxes / max(kept_images, 1), 2),
        mean_confidence=round(float(scores.mean()), 4) if len(scores) else 0.0,
        confidence_histogram={"edges": [round(e, 2) for e in np.linspace(0, 1, HIST_BINS + 1)],
                              "counts": [int(h) for h in hist]},
        class_counts={str(int(c)): int(n) for c, n in zip(*np.unique(classes, return_counts=True), strict=True)},
    )  # fmt: skip
    return TeacherData(shards, figures)
