"""Generated pose-estimation data: one stick figure per image and its five keypoints, COCO style.

Each ``size`` x ``size`` image holds a figure (a head disc, a torso, two arms and two legs drawn as
thick lines) of random size, place and pose; its keypoints are the head's centre and the ends of the
limbs (:data:`KEYPOINTS`), labelled ``(x, y, v)`` in the image's pixel coordinates (pixel ``i`` spans
``[i, i + 1)``) with COCO's visibility: 2, or 0 (not labelled) for one keypoint in twenty. Two domains:

* ``"studio"`` (the host's pretraining domain): a dark figure on light diagonal stripes, little noise;
* ``"field"`` (the board's domain): the figure as dark on a lighter checkerboard, noisier, each image's
  colours scaled at random (the backgrounds of :mod:`seg_shapes`).

:func:`stick_figures` is the reference recipe's ``[data].make`` (``recipes/keypoints.toml``): it also
pretrains the U-Net of ``unet.py`` as a heatmap model on the studio domain until its held-out OKS AP
reaches its target (:mod:`targets`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

KEYPOINTS = ("head", "left_hand", "right_hand", "left_foot", "right_foot")
DOMAINS = ("studio", "field")
SIZE = 32
PRETRAIN_TARGET = 0.7  # the base's held-out OKS AP on its own (studio) domain
HEATMAP_SIGMA = 2.0  # the recipe's keypoints.heatmap_sigma


def _segment(size: int, a: np.ndarray, b: np.ndarray, width: float) -> np.ndarray:
    """Pixels whose centre lies within ``width / 2`` of the segment from ``a`` to ``b`` (x, y)."""
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    p = np.stack([xx, yy], axis=-1)
    ab = b - a
    t = np.clip(((p - a) @ ab) / max(float(ab @ ab), 1e-9), 0, 1)
    return np.linalg.norm(p - (a + t[..., None] * ab), axis=-1) <= width / 2


def figure(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One figure's pixels ``[size, size]`` and its keypoints ``[5, 2]`` (x, y) in :data:`KEYPOINTS` order."""
    s = rng.uniform(size * 0.25, size * 0.4)  # half the figure's height
    cx, cy = rng.uniform(s * 0.8, size - s * 0.8), rng.uniform(s * 1.05, size - s * 1.05)
    neck, hip = np.array([cx, cy - 0.45 * s]), np.array([cx, cy + 0.25 * s])
    head = neck + [rng.uniform(-0.15, 0.15) * s, -0.35 * s]
    arm, leg = (rng.uniform(0.15, 1.2, 2) * np.pi / 2 for _ in range(2))
    hands = [neck + 0.75 * s * np.array([-np.sin(arm[0]), np.cos(arm[0])]),
             neck + 0.75 * s * np.array([np.sin(arm[1]), np.cos(arm[1])])]  # fmt: skip
    feet = [hip + 0.75 * s * np.array([-np.sin(leg[0] / 3), np.cos(leg[0] / 3)]),
            hip + 0.75 * s * np.array([np.sin(leg[1] / 3), np.cos(leg[1] / 3)])]  # fmt: skip
    width = max(1.5, s * 0.18)
    mask = _segment(size, neck, hip, width)
    for end, start in zip([*hands, *feet], [neck, neck, hip, hip], strict=True):
        mask |= _segment(size, start, end, width)
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    mask |= (xx - head[0]) ** 2 + (yy - head[1]) ** 2 <= (0.22 * s) ** 2
    return mask, np.stack([head, *hands, *feet])


def make_set(n: int, domain: str, seed: int, size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images ``x`` (float32 ``[n, 3, size, size]``, centred as (pixel - 0.5) / 0.25) and keypoints
    ``y`` (float32 ``[n, 5, 3]``: x, y, visibility) of ``domain``."""
    from seg_shapes import _background  # recipes/seg_shapes.py: the same two domains' backgrounds

    if domain not in DOMAINS:
        raise ValueError(f"domain: expected one of {DOMAINS}, got {domain!r}")
    rng = np.random.default_rng(seed)
    x = np.empty((n, 3, size, size), np.float32)
    y = np.zeros((n, len(KEYPOINTS), 3), np.float32)
    for i in range(n):
        img = _background(rng, size, domain)
        mask, points = figure(rng, size)
        if domain == "field":  # the checkerboard lighter, the figure as dark as in the studio
            img = img + 0.35
        img[:, mask] = rng.uniform(0, 0.35, 3)[:, None]
        if domain == "field":
            img = img * rng.uniform(0.6, 1.4, 3)[:, None, None]
        img = img + rng.normal(0, 0.05 if domain == "studio" else 0.12, img.shape)
        x[i] = (img - 0.5) / 0.25
        y[i, :, :2] = points
        y[i, :, 2] = np.where(rng.random(len(KEYPOINTS)) < 0.05, 0.0, 2.0)
    return x, y


def _save(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x, y=y)


def stick_figures(out_dir: Path, train: int = 256, test: int = 96) -> None:
    """The reference keypoints recipe's data: ``base_weights.pt`` (the heatmap U-Net pretrained on
    studio figures until its held-out OKS AP reaches PRETRAIN_TARGET), and the board's field domain:
    ``train.npz`` (``train`` images, uploaded), ``eval.npz`` (64, evaluated on the board each epoch)
    and ``test.npz`` (``test``, the host's before/after set)."""
    from pose_base import pretrain_heatmaps  # recipes/pose_base.py: the recipe folder is on the path

    out_dir, start = Path(out_dir), time.perf_counter()
    _save(out_dir / "train.npz", *make_set(train, "field", seed=1))
    _save(out_dir / "eval.npz", *make_set(64, "field", seed=2))
    _save(out_dir / "test.npz", *make_set(test, "field", seed=3))
    studio, heldout = make_set(512, "studio", seed=4), make_set(96, "studio", seed=5)
    fit = pretrain_heatmaps(studio, heldout, out_dir / "base_weights.pt", len(KEYPOINTS), PRETRAIN_TARGET)
    print(f"stick figures: {fit.line().strip()} ({time.perf_counter() - start:.1f} s in all)", flush=True)
