"""SSD box arithmetic in numpy only: priors, matching, offset encoding, decoding and per-class NMS.

One implementation for both sides: the host matches annotated boxes to priors to build a
detector's training targets, and a board application decodes the inference model's
``(scores, boxes)`` with :func:`postprocess` (shipped with the agent, needs nothing but numpy).

Boxes are ``[x1, y1, x2, y2]`` in [0, 1] image coordinates unless a name says ``center``
(``[cx, cy, w, h]``). Offsets follow the SSD convention with variances ``(0.1, 0.2)``:
``((cx - pcx) / (pw * 0.1), (cy - pcy) / (ph * 0.1), log(w / pw) / 0.2, log(h / ph) / 0.2)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CENTER_VARIANCE = 0.1
SIZE_VARIANCE = 0.2


@dataclass(frozen=True)
class FeatureSpec:
    """One detection feature map: its size in cells, the pixel sizes of its two square priors
    (``min_size`` and ``sqrt(min_size * max_size)``) and the aspect ratios of its other priors
    (each ratio r gives an r:1 and a 1:r prior of side ``min_size``)."""

    cells: int
    min_size: float
    max_size: float
    aspect_ratios: tuple[float, ...] = (2.0, 3.0)

    @property
    def per_cell(self) -> int:
        return 2 + 2 * len(self.aspect_ratios)


def priors(specs: list[FeatureSpec], image_size: int) -> np.ndarray:
    """Center-form priors ``[P, 4]`` (float32, clipped to [0, 1]), feature map by feature map,
    cell by cell (row major), in the order: small square, large square, then r:1, 1:r per ratio."""
    out = []
    for spec in specs:
        step = 1.0 / spec.cells
        small = spec.min_size / image_size
        large = np.sqrt(spec.min_size * spec.max_size) / image_size
        shapes = [(small, small), (large, large)]
        for r in spec.aspect_ratios:
            shapes += [(small * np.sqrt(r), small / np.sqrt(r)), (small / np.sqrt(r), small * np.sqrt(r))]
        for row in range(spec.cells):
            for col in range(spec.cells):
                cx, cy = (col + 0.5) * step, (row + 0.5) * step
                out += [(cx, cy, w, h) for w, h in shapes]
    return np.clip(np.asarray(out, dtype=np.float32), 0.0, 1.0)


def center_to_corner(boxes: np.ndarray) -> np.ndarray:
    """``[cx, cy, w, h]`` -> ``[x1, y1, x2, y2]``."""
    half = boxes[..., 2:] / 2
    return np.concatenate([boxes[..., :2] - half, boxes[..., :2] + half], axis=-1)


def corner_to_center(boxes: np.ndarray) -> np.ndarray:
    """``[x1, y1, x2, y2]`` -> ``[cx, cy, w, h]``."""
    return np.concatenate([(boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]], axis=-1)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of corner boxes ``a [A, 4]`` and ``b [B, 4]``: ``[A, B]``."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=-1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-12)


def encode(boxes: np.ndarray, center_priors: np.ndarray) -> np.ndarray:
    """Offsets ``[P, 4]`` of corner ``boxes [P, 4]`` from their priors."""
    c = corner_to_center(boxes)
    return np.concatenate(
        [
            (c[:, :2] - center_priors[:, :2]) / (center_priors[:, 2:] * CENTER_VARIANCE),
            np.log(np.maximum(c[:, 2:], 1e-12) / center_priors[:, 2:]) / SIZE_VARIANCE,
        ],
        axis=1,
    ).astype(np.float32)


def decode(offsets: np.ndarray, center_priors: np.ndarray) -> np.ndarray:
    """Corner boxes ``[..., P, 4]`` from offsets ``[..., P, 4]`` (the inverse of :func:`encode`)."""
    centers = offsets[..., :2] * CENTER_VARIANCE * center_priors[:, 2:] + center_priors[:, :2]
    sizes = np.exp(offsets[..., 2:] * SIZE_VARIANCE) * center_priors[:, 2:]
    return center_to_corner(np.concatenate([centers, sizes], axis=-1))


def match(
    boxes: np.ndarray, labels: np.ndarray, center_priors: np.ndarray, threshold: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Per-prior targets of one image: class ids ``[P]`` (0 = background, an object's label + 1)
    and offsets ``[P, 4]``. A prior takes the box it overlaps most when IoU >= ``threshold``; every
    box also keeps its best prior, so no object goes without one."""
    n = len(center_priors)
    if len(boxes) == 0:
        return np.zeros(n, np.int64), np.zeros((n, 4), np.float32)
    overlaps = iou(boxes.astype(np.float32), center_to_corner(center_priors))  # [G, P]
    best_box = overlaps.argmax(axis=0)
    best_overlap = overlaps.max(axis=0)
    best_prior = overlaps.argmax(axis=1)
    best_overlap[best_prior] = 2.0  # forced matches beat any threshold
    best_box[best_prior] = np.arange(len(boxes))
    classes = np.where(best_overlap >= threshold, labels[best_box].astype(np.int64) + 1, 0)
    return classes, encode(boxes[best_box], center_priors)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, top_k: int = 200) -> np.ndarray:
    """Indices of the boxes greedy non-maximum suppression keeps, best score first."""
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while order.size and len(keep) < top_k:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        order = rest[iou(boxes[i : i + 1], boxes[rest])[0] <= iou_threshold]
    return np.asarray(keep, dtype=np.int64)


def postprocess(
    scores: np.ndarray,
    offsets: np.ndarray,
    center_priors: np.ndarray,
    *,
    score_threshold: float = 0.3,
    iou_threshold: float = 0.45,
    top_k: int = 200,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Detections per image from the inference model's outputs.

    ``scores [N, P, C]`` are class probabilities with background at index 0, ``offsets [N, P, 4]``.
    Returns, per image, ``(boxes [K, 4], labels [K], scores [K])`` after per-class NMS, labels
    counted without the background (0 = the first object class), best ``top_k`` by score.
    """
    out = []
    for img_scores, img_offsets in zip(scores, offsets, strict=True):
        boxes = np.clip(decode(img_offsets, center_priors), 0.0, 1.0)
        kept_boxes, kept_labels, kept_scores = [], [], []
        for cls in range(1, img_scores.shape[1]):
            mask = img_scores[:, cls] > score_threshold
            if not mask.any():
                continue
            idx = np.flatnonzero(mask)
            keep = idx[nms(boxes[idx], img_scores[idx, cls], iou_threshold, top_k)]
            kept_boxes.append(boxes[keep])
            kept_labels.append(np.full(len(keep), cls - 1, np.int64))
            kept_scores.append(img_scores[keep, cls])
        if not kept_boxes:
            out.append((np.zeros((0, 4), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32)))
            continue
        b, lab, s = np.concatenate(kept_boxes), np.concatenate(kept_labels), np.concatenate(kept_scores)
        best = np.argsort(-s, kind="stable")[:top_k]
        out.append((b[best], lab[best], s[best]))
    return out
