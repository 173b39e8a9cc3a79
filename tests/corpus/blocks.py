"""Building blocks of generated classifiers: the idioms of hand-written model code, each a small
``nn.Module`` made from a JSON-able spec (``{"kind": ..., ...}``), so a generated model is a list of
specs that can be saved, shrunk and rebuilt (tests/corpus/generator.py draws them).

Kinds: ``conv`` (conv/BN/activation in any order, kernel, stride, groups or depthwise, dilation),
``residual`` (two convs and an Add, a projection when the shape changes), ``dense`` (Concat of the
input and a conv of it), ``se`` (squeeze-excitation gate: fixed, adaptive or mean pooling),
``pool`` (fixed-kernel average or max, ``F.avg_pool2d(x, 2)``), ``upsample`` (nearest, bilinear,
transposed conv, pixel shuffle, then back down), ``tokens`` (LayerNorm/Linear/GELU MLP over tokens),
``attention`` (multi-head self-attention over tokens), ``shared`` (one conv applied twice), ``norm``
(GroupNorm / InstanceNorm / channel LayerNorm); heads pool (adaptive, mean, fixed, max), flatten
(view, flatten, reshape) and classify (one or two Linear layers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {
    "relu": nn.ReLU, "relu6": nn.ReLU6, "silu": nn.SiLU, "gelu": nn.GELU, "hardswish": nn.Hardswish,
    "leaky": lambda: nn.LeakyReLU(0.1), "elu": nn.ELU, "mish": nn.Mish, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh,
}  # fmt: skip


def act(name: str, channels: int) -> nn.Module:
    """The activation called ``name`` (``prelu`` has one slope per channel)."""
    return nn.PReLU(channels) if name == "prelu" else ACTIVATIONS[name]()


class Conv(nn.Module):
    """conv, BatchNorm and activation in the order the spec gives (``order`` of "c", "b", "a")."""

    def __init__(self, cin: int, spec: dict):
        super().__init__()
        cout, k, groups = spec["out"], spec["k"], spec.get("groups", 1)
        if groups == "depthwise":
            groups = cin if cout % cin == 0 else 1
        elif cin % groups or cout % groups:
            groups = 1
        self.order = spec.get("order", "cba")
        pad = spec.get("dilation", 1) * (k // 2)
        self.conv = nn.Conv2d(
            cin, cout, k, spec.get("stride", 1), pad, spec.get("dilation", 1), groups, spec.get("bias", True)
        )
        self.bn = nn.BatchNorm2d(cin if self.order.index("b") < self.order.index("c") else cout)
        self.act = act(
            spec.get("act", "relu"), cin if self.order.index("a") < self.order.index("c") else cout
        )
        self.out = cout

    def forward(self, x):
        for step in self.order:
            x = {"c": self.conv, "b": self.bn, "a": self.act}[step](x)
        return x


class Residual(nn.Module):
    def __init__(self, cin: int, spec: dict):
        super().__init__()
        self.a = Conv(cin, {**spec, "kind": "conv"})
        self.b = Conv(self.a.out, {**spec, "stride": 1, "groups": 1, "kind": "conv"})
        same = cin == self.a.out and spec.get("stride", 1) == 1
        self.proj = None if same else nn.Conv2d(cin, self.a.out, 1, spec.get("stride", 1), bias=False)
        self.out = self.a.out

    def forward(self, x):
        return self.b(self.a(x)) + (x if self.proj is None else self.proj(x))


class Dense(nn.Module):
    def __init__(self, cin: int, spec: dict):
        super().__init__()
        self.conv = Conv(cin, {**spec, "stride": 1, "kind": "conv"})
        self.out = cin + self.conv.out

    def forward(self, x):
        return torch.cat([x, self.conv(x)], 1)


class SE(nn.Module):
    def __init__(self, cin: int, spec: dict):
        super().__init__()
        self.pool = spec.get("pool", "adaptive")
        self.reduce = nn.Conv2d(cin, max(1, cin // 4), 1)
        self.expand = nn.Conv2d(max(1, cin // 4), cin, 1)
        self.out = cin

    def forward(self, x):
        if self.pool == "fixed":
            s = F.avg_pool2d(x, x.size(2))
        elif self.pool == "mean":
            s = x.mean((2, 3), keepdim=True)
        else:
            s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.relu(self.reduce(s))))


class Pool(nn.Module):
    def __init__(self, cin: int, spec: dict):
        super().__init__()
        self.kind, self.out = spec.get("pool", "avg"), cin

    def forward(self, x):
        if self.kind == "max":
            return F.max_pool2d(x, 2)
        if self.kind == "max_ceil":
            return F.max_pool2d(x, 3, 2, ceil_mode=True)
        if self.kind == "avg_ceil":
            return F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False)
        return F.avg_pool2d(x, 2)


class Upsample(nn.Module):
    def __init__(self, cin: int, spec: dict):
        super().__init__()
        self.kind, self.out = spec.get("up", "nearest"), cin
        self.up = nn.ConvTranspose2d(cin, cin, 2, 2) if self.kind == "transposed" else None
        self.ps = nn.Conv2d(cin, 4 * cin, 1) if self.kind == "pixel_shuffle" else None
        self.down = nn.Conv2d(cin, cin, 3, 2, 1)

    def forward(self, x):
        if self.up is not None:
            x = self.up(x)
        elif self.ps is not None:
            x = F.pixel_shuffle(self.ps(x), 2)
        else:
            x = F.interpolate(x, scale_factor=2, mode=self.kind)
        return self.down(x)


class Tokens(nn.Module):
    def __init__(self, cin: int, spec: dict):
        super().__init__()
        self.attention = spec["kind"] == "attention"
        self.norm = nn.LayerNorm(cin)
        self.mix = (
            nn.MultiheadAttention(cin, 2 if cin % 2 == 0 else 1, batch_first=True) if self.attention else None
        )
        self.fc1, self.fc2 = nn.Linear(cin, 2 * cin), nn.Linear(2 * cin, cin)
        self.out = cin

    def forward(self, x):
        n, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)
        u = self.norm(t)
        t = t + (self.mix(u, u, u)[0] if self.mix is not None else self.fc2(F.gelu(self.fc1(u))))
        return t.transpose(1, 2).reshape(n, c, h, w)


class Shared(nn.Module):
    def __init__(self, cin: int, spec: dict):
        super().__init__()
        self.conv = nn.Conv2d(cin, cin, 3, padding=1)
        self.out = cin

    def forward(self, x):
        return self.conv(F.relu(self.conv(x)))


class Norm(nn.Module):
    def __init__(self, cin: int, spec: dict):
        super().__init__()
        self.kind, self.out = spec.get("norm", "group"), cin
        groups = 2 if cin % 2 == 0 else 1
        self.norm = {"group": nn.GroupNorm(groups, cin), "instance": nn.InstanceNorm2d(cin, affine=True),
                     "layer": nn.LayerNorm(cin)}[self.kind]  # fmt: skip

    def forward(self, x):
        if self.kind == "layer":
            return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.norm(x)


BLOCKS = {"conv": Conv, "residual": Residual, "dense": Dense, "se": SE, "pool": Pool, "upsample": Upsample,
          "tokens": Tokens, "attention": Tokens, "shared": Shared, "norm": Norm}  # fmt: skip


class Generated(nn.Module):
    """A stem conv, the spec's blocks, a pooled, flattened head and an optional embedded loss."""

    def __init__(self, spec: dict, num_classes: int = 4):
        super().__init__()
        self.spec = spec
        cin, blocks = 3, []
        for block in spec["blocks"]:
            blocks.append(BLOCKS[block["kind"]](cin, block))
            cin = blocks[-1].out
        self.blocks = nn.Sequential(*blocks)
        hidden = spec["head"].get("hidden", 0)
        self.hidden = nn.Linear(cin, hidden) if hidden else None
        self.fc = nn.Linear(hidden or cin, num_classes)

    def features(self, x):
        x = self.blocks(x)
        pool = self.spec["head"].get("pool", "adaptive")
        if pool == "fixed":
            x = F.avg_pool2d(x, x.size(2))
        elif pool == "mean":
            x = x.mean((2, 3), keepdim=True)
        elif pool == "max":
            x = F.adaptive_max_pool2d(x, 1)
        else:
            x = F.adaptive_avg_pool2d(x, 1)
        flat = self.spec["head"].get("flatten", "flatten")
        x = (
            x.view(x.size(0), -1)
            if flat == "view"
            else (x.reshape(-1, x.shape[1]) if flat == "reshape" else torch.flatten(x, 1))
        )
        return F.relu(self.hidden(x)) if self.hidden is not None else x

    def forward(self, x, labels=None):
        logits = self.fc(self.features(x))
        if labels is None:
            return logits
        path = self.spec.get("labels", "int64")
        target = labels.int() if path == "int32" else labels.long()
        return F.cross_entropy(logits, target), logits
