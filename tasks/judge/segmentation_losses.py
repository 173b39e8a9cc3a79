"""The segmentation losses on the host, in numpy, as the board's graphs compute them
(:mod:`tasks.prepare.losses.segmentation`): per-pixel cross-entropy over the pixels that are not
ignored, soft Dice over softmax probabilities, or their sum.

Each image's sums are kept (:func:`loss_sums`), so the same pass gives the test set's loss (the
whole set taken as one batch) and each image's own (the promotion gate's paired figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.errors import EvaluationError
from tasks.recipe.segmentation import DICE_SMOOTH, SEGMENTATION_LOSSES

CHUNK = 16  # images whose float64 softmax is held at once


@dataclass(frozen=True)
class LossSums:
    """Per image: cross-entropy summed over kept pixels, their count, and per class the Dice sums."""

    ce: np.ndarray  # [N]
    kept: np.ndarray  # [N]
    inter: np.ndarray  # [N, C]: sum of p_c * t_c
    probs: np.ndarray  # [N, C]: sum of p_c over kept pixels
    truth: np.ndarray  # [N, C]: kept pixels labelled c


def check_pair(scores: np.ndarray, labels: np.ndarray) -> None:
    """EvaluationError unless scores are ``[N, C, spatial...]`` and labels ``[N, spatial...]``."""
    if scores.ndim < 3 or labels.shape != (scores.shape[0], *scores.shape[2:]):
        raise EvaluationError(
            f"segmentation: expected outputs [N, C, H, W] and labels [N, H, W], got outputs "
            f"{list(scores.shape)} and labels {list(labels.shape)}"
        )


def loss_sums(scores: np.ndarray, labels: np.ndarray, ignore_index: int) -> LossSums:
    """Each image's cross-entropy and Dice sums (:class:`LossSums`)."""
    check_pair(scores, labels)
    n, classes = scores.shape[:2]
    ids = np.arange(classes).reshape([1, classes] + [1] * (labels.ndim - 1))
    parts: list[tuple[np.ndarray, ...]] = []
    for start in range(0, n, CHUNK):
        z = scores[start : start + CHUNK].astype(np.float64)
        y = labels[start : start + CHUNK].astype(np.int64)
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        kept = y != ignore_index
        axes = tuple(range(1, y.ndim))
        picked = np.take_along_axis(logp, np.where(kept, y, 0)[:, None], axis=1)[:, 0]
        p = np.exp(logp) * kept[:, None]
        t = (y[:, None] == ids) & kept[:, None]
        sums = tuple(range(2, z.ndim))
        parts.append(
            (-(picked * kept).sum(axes), kept.sum(axes), (p * t).sum(sums), p.sum(sums), t.sum(sums))
        )
    return LossSums(*(np.concatenate(col).astype(np.float64) for col in zip(*parts, strict=True)))


def _dice(inter: np.ndarray, probs: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """1 - the mean over classes (last axis) of the smoothed Dice score."""
    return 1.0 - ((2 * inter + DICE_SMOOTH) / (probs + truth + DICE_SMOOTH)).mean(axis=-1)


def set_loss(kind: str, s: LossSums, dice_weight: float = 1.0) -> float:
    """``kind`` of the whole set taken as one batch."""
    ce = float(s.ce.sum() / max(s.kept.sum(), 1.0))
    dice = float(_dice(s.inter.sum(0), s.probs.sum(0), s.truth.sum(0)))
    return _combine(kind, ce, dice, dice_weight)


def image_losses(kind: str, s: LossSums, dice_weight: float = 1.0) -> np.ndarray:
    """``kind`` of each image alone."""
    ce = s.ce / np.maximum(s.kept, 1.0)
    return _combine(kind, ce, _dice(s.inter, s.probs, s.truth), dice_weight)


def _combine(kind: str, ce: Any, dice: Any, dice_weight: float) -> Any:  # floats or arrays alike
    if kind not in SEGMENTATION_LOSSES:
        raise EvaluationError(
            f"segmentation loss: expected one of {', '.join(SEGMENTATION_LOSSES)}, got {kind!r}"
        )
    if kind == "cross-entropy":
        return ce
    return dice if kind == "dice" else ce + dice_weight * dice
