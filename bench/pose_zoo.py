"""Pose-estimation model idioms for the keypoints corpus (bench/keypoints_corpus.py), each built from
public parts or as its paper draws it, K keypoints out:

* SimpleBaseline (Xiao et al. 2018): a torchvision backbone (ResNet-18, MobileNetV2; random init)
  and three stride-2 transposed convolutions to heatmaps at a quarter of the input's size;
* the recipes' U-Net (``recipes/unet.py``) with one heatmap per keypoint, in its idioms;
* DeepPose-style regression (Toshev & Szegedy 2014): a ResNet-18 whose classifier gives ``[N, K, 2]``;
* integral regression / soft-argmax (Sun et al. 2018, DSNT): the U-Net's heatmaps as a softmax over
  the pixels, whose expected position is the keypoint ``[N, K, 2]`` in input pixels;
* a one-stack hourglass (Newell et al. 2016): residual blocks down and up with skip branches.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recipes"))

K = 5


def _deconv_head(cin: int, k: int, width: int = 64) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [nn.ConvTranspose2d(cin, width, 4, stride=2, padding=1, bias=False), nn.BatchNorm2d(width),
                   nn.ReLU()]  # fmt: skip
        cin = width
    return nn.Sequential(*layers, nn.Conv2d(width, k, 1))


class SimpleBaseline(nn.Module):
    """A backbone at stride 32, three deconvolutions to stride 4, a 1x1 conv to K heatmaps."""

    def __init__(self, backbone: str = "resnet18", k: int = K) -> None:
        super().__init__()
        from torchvision import models

        if backbone == "resnet18":
            net = models.resnet18(weights=None)
            self.features, channels = nn.Sequential(*list(net.children())[:-2]), 512
        else:
            self.features, channels = models.mobilenet_v2(weights=None).features, 1280
        self.head = _deconv_head(channels, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Regression(nn.Module):
    """ResNet-18 whose classifier regresses the K keypoints' (x, y), ``[N, K, 2]`` in input pixels."""

    def __init__(self, k: int = K, side: int = 64) -> None:
        super().__init__()
        from torchvision import models

        self.net = models.resnet18(weights=None, num_classes=2 * k)
        self.k, self.side = k, side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.sigmoid(self.net(x)) * self.side).reshape(-1, self.k, 2)


class Integral(nn.Module):
    """Soft-argmax over the U-Net's heatmaps: each keypoint the expectation of the pixel centres,
    as a sum of products (``expect = "sum"``, kornia's and DSNT's way), a product with an ``[HW, 1]``
    matrix (``"matrix"``) or with the ``[HW]`` vector (``"vector"``)."""

    def __init__(self, k: int = K, side: int = 32, expect: str = "sum") -> None:
        super().__init__()
        from unet import unet

        self.heat = unet(k)
        centres = torch.arange(side, dtype=torch.float32) + 0.5
        self.register_buffer("xs", centres.repeat(side))  # pixel (row r, col c) at r * side + c
        self.register_buffer("ys", centres.repeat_interleave(side))
        self.expect = expect

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.heat(x)
        p = F.softmax(h.flatten(2), dim=-1)
        if self.expect == "sum":
            return torch.stack([(p * self.xs).sum(-1), (p * self.ys).sum(-1)], dim=-1)
        if self.expect == "matrix":
            return p @ torch.stack([self.xs, self.ys], dim=-1)
        return torch.stack([p @ self.xs, p @ self.ys], dim=-1)


class Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1, bias=False))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class Hourglass(nn.Module):
    """One hourglass of ``depth`` poolings: a skip branch at each level, nearest upsampling."""

    def __init__(self, c: int, depth: int) -> None:
        super().__init__()
        self.skip, self.down = Residual(c), Residual(c)
        self.inner = Hourglass(c, depth - 1) if depth > 1 else Residual(c)
        self.up = Residual(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = self.up(self.inner(self.down(F.max_pool2d(x, 2))))
        return self.skip(x) + F.interpolate(low, scale_factor=2.0, mode="nearest")


class StackedHourglass(nn.Module):
    def __init__(self, k: int = K, c: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.hourglass, self.head = Hourglass(c, 3), nn.Conv2d(c, k, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.hourglass(self.stem(x)))


def build(kind: str, **kwargs: object) -> nn.Module:
    """The corpus case ``kind`` (seeded: the same weights on every machine)."""
    from unet import unet

    torch.manual_seed(0)
    if kind == "simplebaseline":
        return SimpleBaseline(**kwargs)  # type: ignore[arg-type]
    if kind == "regression":
        return Regression(**kwargs)  # type: ignore[arg-type]
    if kind == "integral":
        return Integral(**kwargs)  # type: ignore[arg-type]
    if kind == "hourglass":
        return StackedHourglass(**kwargs)  # type: ignore[arg-type]
    return unet(K, **kwargs)  # type: ignore[arg-type]
