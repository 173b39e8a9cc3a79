"""Generated semantic segmentation data: shapes on textured backgrounds, one class per pixel.

Each ``size`` x ``size`` image holds 1-3 shapes (square, disc, triangle: classes 1-3; background 0)
whose sides span a quarter to half of the image; a shape's outline is labelled ``IGNORE`` (255), as
Pascal VOC marks its object boundaries. Two domains:

* ``"studio"`` (the host's pretraining domain): dark shapes on light diagonal stripes, little noise;
* ``"field"`` (the board's domain): bright shapes on a dark checkerboard of another scale, more noise,
  every image's colours scaled at random: the pretrained model's mIoU falls from ~0.75 to ~0.1 there.

:func:`segmentation_shapes` is the reference recipe's ``[data].make``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

CLASSES = ("background", "square", "disc", "triangle")
IGNORE = 255
DOMAINS = ("studio", "field")
SIZE = 32


def _background(rng: np.random.Generator, size: int, domain: str) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    freq = rng.uniform(2, 6) / size
    if domain == "studio":
        angle = rng.uniform(0, np.pi)
        bg = 0.6 + 0.2 * np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle)))
        return bg[None] * rng.uniform(0.7, 1.0, 3)[:, None, None]
    bg = 0.3 + 0.25 * np.sign(np.sin(2 * np.pi * freq * xx) * np.sin(2 * np.pi * freq * yy))
    return bg[None] * rng.uniform(0.5, 1.2, 3)[:, None, None]


def shape_mask(kind: int, size: int, cx: float, cy: float, side: float) -> np.ndarray:
    """Pixels of a square (1), disc (2) or triangle (3, apex up) of ``side`` centred at (cx, cy)."""
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    if kind == 1:
        return (np.abs(xx - cx) <= side / 2) & (np.abs(yy - cy) <= side / 2)
    if kind == 2:
        return (xx - cx) ** 2 + (yy - cy) ** 2 <= (side / 2) ** 2
    rel = (yy - (cy - side / 2)) / side
    return (rel >= 0) & (rel <= 1) & (np.abs(xx - cx) <= rel * side / 2)


def outline(mask: np.ndarray) -> np.ndarray:
    """The pixels of ``mask`` with a 4-neighbour outside it."""
    inner = mask.copy()
    inner[1:] &= mask[:-1]
    inner[:-1] &= mask[1:]
    inner[:, 1:] &= mask[:, :-1]
    inner[:, :-1] &= mask[:, 1:]
    return mask & ~inner


def make_set(n: int, domain: str, seed: int, size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images ``x`` (float32 ``[n, 3, size, size]``, centred as (pixel - 0.5) / 0.25) and masks
    ``y`` (int64 ``[n, size, size]``: class ids, IGNORE on outlines) of ``domain``."""
    if domain not in DOMAINS:
        raise ValueError(f"domain: expected one of {DOMAINS}, got {domain!r}")
    rng = np.random.default_rng(seed)
    x = np.empty((n, 3, size, size), np.float32)
    y = np.zeros((n, size, size), np.int64)
    for i in range(n):
        img = _background(rng, size, domain)
        for _ in range(rng.integers(1, 4)):
            kind, side = int(rng.integers(1, 4)), rng.uniform(size / 4, size / 2)
            cx, cy = rng.uniform(side / 2, size - side / 2, 2)
            mask = shape_mask(kind, size, cx, cy, side)
            colour = rng.uniform(0, 0.5, 3) if domain == "studio" else rng.uniform(0.5, 1.0, 3)
            img[:, mask] = colour[:, None]
            y[i][mask] = kind
            y[i][outline(mask)] = IGNORE
        if domain == "field":
            img = img * rng.uniform(0.6, 1.4, 3)[:, None, None]
        img = img + rng.normal(0, 0.05 if domain == "studio" else 0.12, img.shape)
        x[i] = (img - 0.5) / 0.25
    return x, y


def _save(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x, y=y)


def segmentation_shapes(out_dir: Path, train: int = 256, test: int = 96) -> None:
    """The reference segmentation recipe's data: ``base_weights.pt`` (the U-Net of ``unet.py``
    pretrained on the host on 512 studio images until its held-out mIoU reaches its target), and the
    board's field domain: ``train.npz`` (``train`` images, uploaded), ``eval.npz`` (64, evaluated on
    the board each epoch) and ``test.npz`` (``test``, the host's before/after set)."""
    from unet import pretrain_unet  # recipes/unet.py: the recipe folder is on the path

    out_dir, start = Path(out_dir), time.perf_counter()
    _save(out_dir / "train.npz", *make_set(train, "field", seed=1))
    _save(out_dir / "eval.npz", *make_set(64, "field", seed=2))
    _save(out_dir / "test.npz", *make_set(test, "field", seed=3))
    studio, heldout = make_set(512, "studio", seed=4), make_set(96, "studio", seed=5)
    fit = pretrain_unet(studio, heldout, out_dir / "base_weights.pt", classes=len(CLASSES))
    print(f"segmentation shapes: {fit} ({time.perf_counter() - start:.1f} s in all)", flush=True)
