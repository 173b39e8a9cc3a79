"""Small U-Net-like segmentation models (class scores ``[N, C, H, W]`` at the input's size) and the
host pretraining of the reference one.

:func:`unet` is the reference recipe's model (``recipes/segmentation.toml``): two poolings, a
decoder that upsamples and concatenates the encoder's features (Ronneberger et al. 2015) at a
width of ``width`` channels, ~30 k parameters at width 8. Its options are the idioms segmentation
code is written with, which the corpus benchmark (``bench/segmentation_corpus.py``) sweeps:
``up`` (nearest or bilinear upsampling, or a transposed convolution), ``norm`` (BatchNorm,
GroupNorm or none), ``depth`` (poolings) and ``dropout`` (``Dropout2d`` in the decoder).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tasks.errors import DataError

PRETRAIN_TARGET = 0.6  # the pretrained model's held-out mIoU on its own (studio) domain
PRETRAIN_EPOCHS = 24  # at most


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(min(4, channels), channels)
    return nn.Identity()


def _block(cin: int, cout: int, norm: str) -> nn.Sequential:
    """Two 3x3 convolutions, each with its normalisation and a ReLU."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=norm == "none"), _norm(norm, cout), nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1, bias=norm == "none"), _norm(norm, cout), nn.ReLU(),
    )  # fmt: skip


class UNet(nn.Module):
    """An encoder of ``depth`` poolings, a decoder of as many upsamplings with skip connections,
    and a 1x1 convolution to ``num_classes`` scores per pixel."""

    def __init__(self, num_classes: int = 4, width: int = 8, depth: int = 2, up: str = "nearest",
                 norm: str = "batch", dropout: float = 0.0, in_channels: int = 3) -> None:  # fmt: skip
        super().__init__()
        chans = [width * 2**k for k in range(depth + 1)]
        self.down = nn.ModuleList([_block(in_channels, chans[0], norm)])
        self.down.extend(_block(chans[k], chans[k + 1], norm) for k in range(depth))
        self.ups = nn.ModuleList(
            nn.ConvTranspose2d(chans[k + 1], chans[k + 1], 2, stride=2)
            if up == "transpose"
            else nn.Identity()
            for k in reversed(range(depth))
        )
        self.up_blocks = nn.ModuleList(
            _block(chans[k + 1] + chans[k], chans[k], norm) for k in reversed(range(depth))
        )
        self.drop = nn.Dropout2d(dropout) if dropout else nn.Identity()
        self.head = nn.Conv2d(chans[0], num_classes, 1)
        self.up = up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for k, block in enumerate(self.down):
            x = block(x if k == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        x = skips.pop()
        for up, block in zip(self.ups, self.up_blocks, strict=True):
            if self.up == "transpose":
                x = up(x)
            else:
                x = F.interpolate(
                    x,
                    scale_factor=2.0,
                    mode=self.up,
                    **({} if self.up == "nearest" else {"align_corners": False}),
                )
            x = block(torch.cat([x, skips.pop()], 1))
        return self.head(self.drop(x))


def unet(num_classes: int = 4, width: int = 8, depth: int = 2, up: str = "nearest", norm: str = "batch",
         dropout: float = 0.0) -> UNet:  # fmt: skip
    """The reference U-Net (seeded: the same weights on every machine before pretraining)."""
    torch.manual_seed(0)
    return UNet(num_classes, width, depth, up, norm, dropout)


def miou(model: nn.Module, x: np.ndarray, y: np.ndarray, classes: int, ignore: int = 255) -> float:
    """mIoU of ``model`` (eval mode) on masks ``y``: over the classes the truth or the prediction holds."""
    model.eval()
    with torch.no_grad():
        pred = torch.cat(
            [model(torch.from_numpy(x[i : i + 64])).argmax(1) for i in range(0, len(x), 64)]
        ).numpy()
    kept = y != ignore
    ious = []
    for c in range(classes):
        union = ((pred == c) | (y == c)) & kept
        if union.any():
            ious.append(float((((pred == c) & (y == c)) & kept).sum() / union.sum()))
    return float(np.mean(ious)) if ious else 0.0


def pretrain_unet(train: tuple[np.ndarray, np.ndarray], heldout: tuple[np.ndarray, np.ndarray], out: Path,
                  classes: int, target: float = PRETRAIN_TARGET, lr: float = 3e-3, batch: int = 32) -> str:  # fmt: skip
    """Train :func:`unet` on ``train`` (per-pixel cross-entropy, outlines ignored, Adam) epoch by
    epoch until its mIoU on ``heldout`` reaches ``target`` (at most PRETRAIN_EPOCHS); save its
    state_dict to ``out`` and return one line saying what it reached. A model that never does
    stops [data].make with a DataError naming its best figure."""
    from models import free_cores  # recipes/models.py: the recipe folder is on the path

    threads = torch.get_num_threads()
    torch.set_num_threads(free_cores(threads))
    try:
        model = unet(classes)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        x, y = (torch.from_numpy(a) for a in train)
        gen, best, epochs = torch.Generator().manual_seed(0), 0.0, 0
        while epochs < PRETRAIN_EPOCHS and best < target:
            model.train()
            for idx in torch.randperm(len(x), generator=gen).split(batch):
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx], ignore_index=255).backward()
                opt.step()
            epochs += 1
            best = max(best, miou(model, *heldout, classes))
    finally:
        torch.set_num_threads(threads)
    if best < target:
        raise DataError(
            f"the U-Net reached held-out mIoU {best:.3f} in {epochs} epochs, short of its target {target}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return f"U-Net pretrained on {len(x)} studio images: held-out mIoU {best:.3f} after {epochs} epochs"
