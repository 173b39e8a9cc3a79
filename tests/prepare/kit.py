"""Small recipes for the foundation tests: a tiny CNN module and data written into a tmp folder."""

from __future__ import annotations

import copy
import json
from pathlib import Path

TINY_MODELS = """
import numpy as np
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, out):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 4 * 4, out)

    def forward(self, x):
        return self.head(torch.flatten(torch.relu(self.bn(self.conv(x))), 1))


class TwoOut(Tiny):
    def forward(self, x):
        y = super().forward(x)
        return y, y * 2


class ConvOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x).mean(dim=(2, 3))


class DropoutNet(Tiny):
    def __init__(self, out):
        super().__init__(out)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.head(self.drop(torch.flatten(torch.relu(self.bn(self.conv(x))), 1)))


def dropout_net(num_classes=3):
    return DropoutNet(num_classes)


class RandomDepth(Tiny):
    # Tiny with torchvision's stochastic depth on its conv, or a hand-written random drop

    def __init__(self, out, own_random):
        from torchvision.ops import StochasticDepth

        super().__init__(out)
        self.own_random = own_random
        self.drop = StochasticDepth(0.5, "row")

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        if self.own_random and self.training:
            y = y * (torch.rand(x.shape[0], 1, 1, 1) > 0.5)
        return self.head(torch.flatten(self.drop(y) + y, 1))


def random_depth(num_classes=3, own_random=False):
    return RandomDepth(num_classes, own_random)


class ScaleOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return torch.flatten(x, 1)[:, :3] * self.scale


def scale_only(num_classes=3):
    return ScaleOnly()


def tiny(num_classes=3):
    return Tiny(num_classes)


def two_out(num_classes=3):
    return TwoOut(num_classes)


def conv_only(num_classes=3):
    return ConvOnly()


def _write(out_dir, y_of):
    rng = np.random.default_rng(0)
    for name, n in (("train", 96), ("test", 32)):
        x = rng.standard_normal((n, 1, 4, 4)).astype(np.float32)
        np.savez(out_dir / f"{name}.npz", x=x, y=y_of(x))


def make_cls(out_dir):
    _write(out_dir, lambda x: (x[:, 0, :2].sum(axis=(1, 2)) > 0).astype(np.int64) + (x[:, 0, 2:].sum(axis=(1, 2)) > 0))


def make_reg(out_dir):
    _write(out_dir, lambda x: np.stack([x.mean(axis=(1, 2, 3)), x[:, 0, 0, 0], x[:, 0, 3, 3]], 1).astype(np.float32))


def make_nan(out_dir):
    make_cls(out_dir)
    with np.load(out_dir / "train.npz") as npz:
        x, y = npz["x"].copy(), npz["y"]
    x[3, 0, 1, 1] = np.nan
    np.savez(out_dir / "train.npz", x=x, y=y)


def make_bin(out_dir):
    _write(out_dir, lambda x: (x.sum(axis=(1, 2, 3)) > 0).astype(np.float32)[:, None])
"""

BASE: dict = {
    "name": "tiny",
    "task": "classification",
    "model": {"callable": "tinymodels:tiny", "num_classes": 3, "input_shape": [1, 4, 4]},
    "trainable": {"strategy": "classifier"},
    "loss": {"kind": "cross-entropy"},
    "optimizer": {"kind": "adamw", "lr": 0.01},
    # the ORT-training runtime (the default is autograd): these tests read its artifacts
    "training": {"batch_size": 16, "epochs": 1, "runtime": "ort-training"},
    "data": {"make": "tinymodels:make_cls", "train": "data/train.npz", "test": "data/test.npz"},
}

# task -> (loss, make, num_classes/out) of a working tiny recipe
TASKS = {
    "cross-entropy": ("classification", "make_cls", 3),
    "mse": ("regression", "make_reg", 3),
    "l1": ("regression", "make_reg", 3),
    "bce-with-logits": ("binary", "make_bin", 1),
}


def merge(base: dict, changes: dict) -> dict:
    """Deep-merge ``changes`` into a copy of ``base``; a value of None deletes the key."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def tiny_recipe(folder: Path, changes: dict | None = None, *, loss: str = "cross-entropy"):
    """A parsed tiny recipe in ``folder`` (module file written there) with ``changes`` applied."""
    from tasks.recipe.load import parse_recipe

    (folder / "tinymodels.py").write_text(TINY_MODELS)
    task, make, n = TASKS[loss]
    data = merge(
        BASE,
        {
            "task": task,
            "loss": {"kind": loss},
            "model": {"num_classes": n},
            "data": {"make": f"tinymodels:{make}"},
        },
    )
    return parse_recipe(merge(data, changes or {}), folder / "recipe.toml")


def toml_value(value) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)  # strings, numbers and booleans read the same in TOML


def write_recipe(folder: Path, changes: dict | None = None, *, loss: str = "cross-entropy") -> Path:
    """Write the tiny recipe (``changes`` applied) and its module into ``folder`` as recipe.toml."""
    recipe = tiny_recipe(folder, changes, loss=loss)
    tables = {k: v for k, v in recipe.raw.items() if isinstance(v, dict)}
    lines = [f"{k} = {toml_value(v)}" for k, v in recipe.raw.items() if k not in tables]
    for name, table in tables.items():
        lines += [f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
    (folder / "recipe.toml").write_text("\n".join(lines) + "\n")
    return folder / "recipe.toml"
