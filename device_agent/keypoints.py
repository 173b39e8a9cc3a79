"""Keypoints in numpy, as the board and the host both read them: a pose model's heatmaps
``[N, K, H, W]`` or coordinates ``[N, K, 2]`` decoded to input pixels, and PCK against COCO labels
``[N, K, 3]`` (x, y, visibility). A board application decodes with :func:`decode`, the trainer
reports each epoch's PCK with :func:`image_pck`, the host (``tasks.judge.keypoints``) scores OKS AP
from the same decoding.

A heatmap's keypoint is its argmax cell's centre in input pixels (cell ``j`` of a heatmap ``s``
times smaller than the input spans pixels ``[j s, (j + 1) s)``), moved a quarter cell towards the
higher neighbour when ``subpixel`` (as SimpleBaseline and HRNet decode); its score is the peak's
value. Coordinates are taken as they are, score 1.
"""

from __future__ import annotations

import numpy as np

from device_agent.keypoints_spec import PCK_THRESHOLD

MIN_SIDE = 1.0  # input pixels: a box of one labelled keypoint still has a scale


def decode(
    out: np.ndarray, input_hw: tuple[int, int], subpixel: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Keypoints ``[N, K, 2]`` (x, y in input pixels) and their scores ``[N, K]`` of heatmaps or coordinates."""
    if out.ndim == 3:
        return out.astype(np.float64), np.ones(out.shape[:2])
    n, k, h, w = out.shape
    flat = out.reshape(n, k, -1).astype(np.float64)
    peak = flat.argmax(axis=2)
    row, col = np.divmod(peak, w)
    score = np.take_along_axis(flat, peak[..., None], axis=2)[..., 0]
    fx, fy = col.astype(np.float64), row.astype(np.float64)
    if subpixel:

        def at(r: np.ndarray, c: np.ndarray) -> np.ndarray:
            idx = np.clip(r, 0, h - 1) * w + np.clip(c, 0, w - 1)
            return np.take_along_axis(flat, idx[..., None], axis=2)[..., 0]

        fx += 0.25 * np.sign(at(row, col + 1) - at(row, col - 1)) * ((col > 0) & (col < w - 1))
        fy += 0.25 * np.sign(at(row + 1, col) - at(row - 1, col)) * ((row > 0) & (row < h - 1))
    sx, sy = input_hw[1] / w, input_hw[0] / h  # a cell's size in input pixels
    return np.stack([(fx + 0.5) * sx, (fy + 0.5) * sy], axis=-1), score  # fmt: skip


def boxes(labels: np.ndarray) -> np.ndarray:
    """``[N, 4]`` (x, y, w, h): each image's labelled keypoints' bounding box (zeros without any)."""
    out = np.zeros((len(labels), 4))
    for i, kp in enumerate(labels):
        seen = kp[kp[:, 2] > 0, :2]
        if len(seen):
            lo, hi = seen.min(axis=0), seen.max(axis=0)
            out[i] = [lo[0], lo[1], hi[0] - lo[0], hi[1] - lo[1]]
    return out


def pck_hits(
    pred: np.ndarray, labels: np.ndarray, threshold: float = PCK_THRESHOLD
) -> tuple[np.ndarray, np.ndarray]:
    """``[N, K]`` each: whether each keypoint is within ``threshold`` of its image's box's larger side
    (only labelled ones count), and its error in input pixels."""
    box = boxes(labels)
    side = np.maximum(np.maximum(box[:, 2], box[:, 3]), MIN_SIDE)
    dist = np.linalg.norm(pred - labels[..., :2], axis=-1)
    return dist <= threshold * side[:, None], dist


def image_pck(out: np.ndarray, labels: np.ndarray, input_hw: tuple[int, int],
              threshold: float = PCK_THRESHOLD, subpixel: bool = True) -> np.ndarray:  # fmt: skip
    """Each image's share of labelled keypoints ``out`` places within ``threshold`` (0 for an image
    without a labelled keypoint)."""
    hit, _ = pck_hits(decode(out, input_hw, subpixel)[0], labels, threshold)
    labelled = labels[..., 2] > 0
    return (hit & labelled).sum(axis=1) / np.maximum(labelled.sum(axis=1), 1)
