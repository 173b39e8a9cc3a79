"""Operators ONNX Runtime 1.19.2 cannot differentiate on the CPU (tasks.prepare.rewrites.decompose and
tasks.prepare.rewrites.resize): each, placed after a trainable conv, fails without its rewrite, computes the
same values after it, and trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tasks.prepare.graph import attr
from tasks.prepare.rewrites import decompose, resize
from tests.prepare.test_fixups import export, generate, run
from tests.prepare.test_pooling import _train_step

TAILS = {
    "elu": (lambda m, x: F.elu(x, 0.7), "Elu"),
    "selu": (lambda m, x: F.selu(x), "Selu"),
    "celu": (lambda m, x: F.celu(x, 1.3), "Celu"),
    "mish": (lambda m, x: F.mish(x), "Softplus"),
    "prelu": (lambda m, x: m.prelu(x), "PRelu"),
    "groupnorm": (lambda m, x: m.gn(x), "InstanceNormalization"),
    "instancenorm": (lambda m, x: m.inorm(x), "InstanceNormalization"),
    "pixel_shuffle": (lambda m, x: F.pixel_shuffle(x, 2), "DepthToSpace"),
    "reflect_pad": (lambda m, x: F.pad(x, (1, 2, 2, 1), mode="reflect"), "Pad"),
    "replicate_pad": (lambda m, x: F.pad(x, (2, 0, 1, 1), mode="replicate"), "Pad"),
    "max_dim": (lambda m, x: x * x.max(dim=1, keepdim=True)[0], "ReduceMax"),
    "amin_spatial": (lambda m, x: x - x.amin((2, 3), keepdim=True), "ReduceMin"),
    "nearest": (lambda m, x: F.interpolate(x, scale_factor=2), "Resize"),
    "bilinear": (lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear"), "Resize"),
    "bilinear_corners": (
        lambda m, x: F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=True),
        "Resize",
    ),
    "bicubic": (lambda m, x: F.interpolate(x, scale_factor=3, mode="bicubic"), "Resize"),
    # the size read from another tensor's shape, as smp's U-Net decoder upsamples to its skip's size
    "size_of_another": (lambda m, x: F.interpolate(F.max_pool2d(x, 2), size=x.shape[2:]), "Resize"),
}


class TailNet(nn.Module):
    def __init__(self, tail):
        super().__init__()
        self.tail = tail
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.prelu = nn.PReLU(8, 0.2)
        self.gn = nn.GroupNorm(2, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        y = TAILS[self.tail][0](self, self.conv(x))
        return self.head(y.mean((2, 3)) if y.shape[1] == 8 else y.mean((2, 3)).repeat(1, 8)[:, :8])


@pytest.mark.parametrize("tail", list(TAILS))
def test_operator_without_cpu_gradient_is_rewritten_and_trains(tail, tmp_path):
    torch.manual_seed(0)
    model = export(TailNet(tail).eval(), (3, 6, 6))
    op = TAILS[tail][1]
    assert op in {n.op_type for n in model.graph.node}
    trainable = ["conv.weight", "head.weight"] + (["prelu.weight"] if tail == "prelu" else [])
    x = np.random.default_rng(1).standard_normal((4, 3, 6, 6)).astype(np.float32)
    before = run(model, x)
    changed = decompose.decompose_operators(model, trainable) + resize.resizes_as_matmuls(model, trainable)
    assert changed == 1 and op not in {n.op_type for n in model.graph.node}
    np.testing.assert_allclose(run(model, x), before, rtol=1e-4, atol=1e-5)
    generate(model, trainable, tmp_path)
    loss, _ = _train_step(tmp_path, 6)
    assert np.isfinite(loss)


def test_operators_off_the_gradient_path_stay():
    model = export(TailNet("elu").eval(), (3, 6, 6))
    assert decompose.decompose_operators(model, ["head.weight"]) == 0
    assert "Elu" in {n.op_type for n in model.graph.node}


class Up(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.up = nn.ConvTranspose2d(4, 6, **kw)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(self.up(torch.relu(self.conv(x))).mean((2, 3)))


TRANSPOSED = [
    {"kernel_size": 2, "stride": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1, "output_padding": 1},
    {"kernel_size": 4, "stride": 2, "padding": 1, "groups": 2, "bias": False},
    {"kernel_size": 3, "stride": 1, "padding": 2, "dilation": 2},
]


@pytest.mark.parametrize("kw", TRANSPOSED, ids=[str(sorted(k.items())) for k in TRANSPOSED])
def test_conv_transpose_becomes_the_conv_it_equals_and_trains(kw, tmp_path):
    from tasks.prepare.rewrites import conv_transpose

    torch.manual_seed(0)
    model = export(Up(**kw).eval(), (3, 5, 5))
    trainable = ["conv.weight", "up.weight", "head.weight"]
    x = np.random.default_rng(1).standard_normal((4, 3, 5, 5)).astype(np.float32)
    before = run(model, x)
    assert conv_transpose.conv_transposes_as_convs(model, trainable) == 1
    assert "ConvTranspose" not in {n.op_type for n in model.graph.node}
    np.testing.assert_allclose(run(model, x), before, rtol=1e-4, atol=1e-5)
    generate(model, trainable, tmp_path)
    loss, _ = _train_step(tmp_path, 5)
    assert np.isfinite(loss)


class BiLSTM(nn.Module):
    """A bidirectional LSTM over the conv's pixels (timm's Sequencer): ORT trains forward LSTMs only."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.lstm = nn.LSTM(4, 5, bidirectional=True, batch_first=True)
        self.head = nn.Linear(10, 2)

    def forward(self, x):
        y, _ = self.lstm(self.conv(x).flatten(2).transpose(1, 2))
        return self.head(y.mean(1))


def test_bidirectional_lstm_becomes_two_forward_ones_and_trains(tmp_path):
    from tasks.prepare.rewrites import lstm

    torch.manual_seed(0)
    model = export(BiLSTM().eval(), (3, 5, 5))
    trainable = ["conv.weight", "head.weight", "lstm.weight_ih_l0", "lstm.weight_hh_l0_reverse"]
    x = np.random.default_rng(1).standard_normal((4, 3, 5, 5)).astype(np.float32)
    before = run(model, x)
    assert lstm.bidirectional_lstms_as_forward(model, trainable) == 1
    directions = [attr(n, "direction", b"forward") for n in model.graph.node if n.op_type == "LSTM"]
    assert directions == [b"forward", b"forward"]
    np.testing.assert_allclose(run(model, x), before, rtol=1e-4, atol=1e-5)
    generate(model, trainable, tmp_path)
    loss, _ = _train_step(tmp_path, 5)
    assert np.isfinite(loss)
