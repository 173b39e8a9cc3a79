"""SSD-Lite on a torchvision MobileNetV2 backbone, its multibox loss inside ``forward``.

``forward(images, labels, gt_offsets)`` returns ``(loss, scores, offsets)``: the loss the training
graph minimises (softmax classification with 3:1 hard-negative mining under ``no_grad``, plus
Smooth-L1 box regression over the positive priors, both divided by the number of positives),
the class probabilities ``[N, P, C + 1]`` (background at 0) and the box offsets ``[N, P, 4]``
the inference model keeps. Targets come from :mod:`tasks.detection.annotations` (per-prior class
ids and offsets matched on the host); :func:`priors_for` gives the priors both sides use.

Smooth-L1 is written out (``F.smooth_l1_loss`` does not export at opset 17) and the mining ranks
a detached loss, so its sort reaches the loss only through a boolean mask (FACTS.md).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torchvision.models import mobilenet_v2

from device_agent import detection as det

NEG_POS_RATIO = 3
# prior sizes as fractions of the input side: (min, max) per feature map, the SSD-Lite layout
# (60/105, 105/150, ..., 285/330 px at 300)
SCALES = [(0.2, 0.35), (0.35, 0.5), (0.5, 0.65), (0.65, 0.8), (0.8, 0.95), (0.95, 1.1)]


def _separable(cin: int, cout: int) -> nn.Sequential:
    """Depthwise 3x3 + BN + ReLU6, then a 1x1 projection: the SSD-Lite head convolution."""
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, padding=1, groups=cin, bias=False),
        nn.BatchNorm2d(cin),
        nn.ReLU6(inplace=False),
        nn.Conv2d(cin, cout, 1),
    )


def _extra(cin: int, cout: int) -> nn.Sequential:
    """A stride-2 block that halves the feature map for the next detection scale."""
    mid = cout // 2
    return nn.Sequential(
        nn.Conv2d(cin, mid, 1, bias=False),
        nn.BatchNorm2d(mid),
        nn.ReLU6(inplace=False),
        nn.Conv2d(mid, mid, 3, stride=2, padding=1, groups=mid, bias=False),
        nn.BatchNorm2d(mid),
        nn.ReLU6(inplace=False),
        nn.Conv2d(mid, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=False),
    )


class SSDLite(nn.Module):
    """SSD-Lite MobileNetV2 for ``num_classes`` object classes at ``size`` x ``size`` inputs."""

    def __init__(self, num_classes: int, size: int = 300, width: float = 1.0) -> None:
        super().__init__()
        self.num_classes, self.size = num_classes, size
        features = mobilenet_v2(weights=None, width_mult=width).features
        self.stem = features[:14]  # stride 16, 96 channels (at width 1)
        self.trunk = features[14:]  # stride 32, 1280 channels (at width 1)
        stem_out, trunk_out = features[13].out_channels, features[-1].out_channels
        self.extras = nn.ModuleList(
            [_extra(trunk_out, 512), _extra(512, 256), _extra(256, 256), _extra(256, 64)]
        )
        channels = [stem_out, trunk_out, 512, 256, 256, 64]
        per_cell = det.FeatureSpec(1, 1, 1).per_cell
        self.cls_heads = nn.ModuleList([_separable(c, per_cell * (num_classes + 1)) for c in channels])
        self.box_heads = nn.ModuleList([_separable(c, per_cell * 4) for c in channels])
        self.specs = priors_specs(self._feature_cells(), size)

    def priors(self) -> np.ndarray:
        """Center-form priors ``[P, 4]`` in [0, 1], in the order of the heads' outputs."""
        return det.priors(self.specs, self.size)

    def _maps(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(images)
        maps = [x]
        x = self.trunk(x)
        maps.append(x)
        for extra in self.extras:
            x = extra(x)
            maps.append(x)
        return maps

    def _feature_cells(self) -> list[int]:
        was = self.training
        self.eval()
        with torch.no_grad():
            cells = [m.shape[-1] for m in self._maps(torch.zeros(1, 3, self.size, self.size))]
        self.train(was)
        return cells

    def heads(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits ``[N, P, C + 1]`` and box offsets ``[N, P, 4]``."""
        n = images.shape[0]
        logits, offsets = [], []
        for fmap, cls_head, box_head in zip(self._maps(images), self.cls_heads, self.box_heads, strict=True):
            logits.append(cls_head(fmap).permute(0, 2, 3, 1).reshape(n, -1, self.num_classes + 1))
            offsets.append(box_head(fmap).permute(0, 2, 3, 1).reshape(n, -1, 4))
        return torch.cat(logits, 1), torch.cat(offsets, 1)

    def forward(
        self, images: torch.Tensor, labels: torch.Tensor, gt_offsets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, offsets = self.heads(images)
        return multibox_loss(logits, offsets, labels, gt_offsets), torch.softmax(logits, -1), offsets


def multibox_loss(
    logits: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor, gt_offsets: torch.Tensor
) -> torch.Tensor:
    """Classification over positives and the hardest 3x as many negatives, plus Smooth-L1 on the
    positives' offsets, divided by the number of positives (at least 1)."""
    ce = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none"
    )
    ce = ce.reshape(labels.shape)
    positive = labels > 0
    with torch.no_grad():
        background = -torch.log_softmax(logits, -1)[..., 0]
        background = torch.where(positive, torch.zeros_like(background), background)
        rank = background.argsort(1, descending=True).argsort(1)
        negative = rank < NEG_POS_RATIO * positive.sum(1, keepdim=True)
    chosen = (positive | negative).float()
    n_pos = torch.clamp(positive.sum().float(), min=1.0)
    diff = torch.abs(offsets - gt_offsets)
    smooth_l1 = torch.where(diff < 1.0, 0.5 * diff * diff, diff - 0.5).sum(-1)
    return ((ce * chosen).sum() + (smooth_l1 * positive.float()).sum()) / n_pos


def priors_specs(cells: list[int], size: int) -> list[det.FeatureSpec]:
    """The feature-map specs of a detector whose maps have ``cells`` cells at input ``size``."""
    return [det.FeatureSpec(c, lo * size, hi * size) for c, (lo, hi) in zip(cells, SCALES, strict=True)]


def priors_for(size: int) -> np.ndarray:
    """Center-form priors ``[P, 4]`` of :class:`SSDLite` at input ``size`` (its maps measured)."""
    return SSDLite(1, size).priors()


def ssdlite(num_classes: int = 3, size: int = 300) -> SSDLite:
    """The recipe's ``model.callable``."""
    return SSDLite(num_classes, size)


class DecodedDetector(nn.Module):
    """A detector as a teacher exports it: ``images -> (scores [N, P, C + 1], boxes [N, P, 4])``,
    class probabilities and corner boxes in [0, 1] (its offsets decoded with its own priors)."""

    def __init__(self, model: SSDLite) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("priors", torch.from_numpy(model.priors()))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, offsets = self.model.heads(images)
        p = self.priors
        centers = offsets[..., :2] * det.CENTER_VARIANCE * p[:, 2:] + p[:, :2]
        sizes = torch.exp(offsets[..., 2:] * det.SIZE_VARIANCE) * p[:, 2:]
        return torch.softmax(logits, -1), torch.cat([centers - sizes / 2, centers + sizes / 2], -1)


def train_detector(model: SSDLite, arrays: dict[str, np.ndarray], *, epochs: int, lr: float = 2e-3,
                   batch: int = 32, seed: int = 0) -> SSDLite:  # fmt: skip
    """Train every parameter of ``model`` on matched targets (``x``, ``y``, ``offsets``) with Adam."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y, o = (torch.from_numpy(arrays[k]) for k in ("x", "y", "offsets"))
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(batch):
            opt.zero_grad()
            model(x[idx], y[idx], o[idx])[0].backward()
            opt.step()
    return model.eval()
