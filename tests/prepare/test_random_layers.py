"""A layer that drops paths at random in training (timm's DropPath, torchvision's StochasticDepth,
a hand-written mask) traces as random nodes; the pipeline finds the modules those nodes come from
and exports them in eval mode, whatever they are called, so the board's model is deterministic."""

from __future__ import annotations

import onnx

from tasks.prepare.pipeline import prepare
from tests.prepare.kit import merge, tiny_recipe

MODULE = """
import torch
from torch import nn


class Skip(nn.Module):  # a DropPath by another name
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training:
            return x
        keep = (torch.rand(x.shape[0], 1, 1, 1) > self.p).to(x.dtype)
        return x * keep / (1 - self.p)


class Net(nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.skip = Skip(0.3)
        self.head = nn.Linear(4 * 16, num_classes)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.head(torch.flatten(y + self.skip(y), 1))


def net(num_classes=3):
    return Net(num_classes)
"""


def test_random_path_drops_export_deterministic_whatever_their_name(tmp_path):
    recipe = tiny_recipe(
        tmp_path, merge({"model": {"callable": "droppath:net"}}, {"trainable": {"strategy": "all"}})
    )
    (tmp_path / "droppath.py").write_text(MODULE)
    done = prepare(recipe, tmp_path / "out")
    ops = {n.op_type for n in onnx.load(str(done.model_onnx)).graph.node}
    assert not ops & {"RandomUniformLike", "RandomUniform", "RandomNormalLike", "Bernoulli"}
    assert done.validation["passed"]


def test_a_random_layer_called_twice_exports_deterministic(tmp_path):
    """SegFormer's blocks call one drop_path module twice: the exporter names the second call's
    nodes ``skip_1``, which is still that module."""
    twice = MODULE.replace("y + self.skip(y)", "y + self.skip(y) + self.skip(2 * y)")
    recipe = tiny_recipe(
        tmp_path, merge({"model": {"callable": "droptwice:net"}}, {"trainable": {"strategy": "all"}})
    )
    (tmp_path / "droptwice.py").write_text(twice)
    done = prepare(recipe, tmp_path / "out")
    ops = {n.op_type for n in onnx.load(str(done.model_onnx)).graph.node}
    assert not ops & {"RandomUniformLike", "RandomUniform", "RandomNormalLike", "Bernoulli"}
    assert done.validation["passed"]
