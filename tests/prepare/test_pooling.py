"""Fixed-kernel average pooling on the gradient path (tasks.prepare.rewrites.pooling): ORT 1.19.2's
AveragePoolGrad sizes its result from the static graph shape, so with a dynamic batch the gradient is
empty and the next broadcasting Mul fails; the rewrite as a depthwise Conv computes the same values
for every padding, count_include_pad and ceil_mode, and its gradient trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tasks.prepare.rewrites import batchnorm, pooling
from tests.prepare.test_fixups import export, generate, run


class PoolNet(nn.Module):
    """conv + BatchNorm + ReLU, a fixed-kernel average pooling, a linear head (hand-written CNN tail)."""

    def __init__(self, pool: dict, size: int):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.AvgPool2d(**pool)
        with torch.no_grad():
            n = self.pool(torch.zeros(1, 4, size, size)).numel()
        self.head = nn.Linear(n, 2)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(torch.relu(self.bn(self.conv(x)))), 1))


class SEGate(nn.Module):
    """A squeeze-excitation gate pooled with ``F.avg_pool2d(x, x.size(2))``: the broadcasting Mul."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Conv2d(4, 4, 1)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = y * torch.sigmoid(self.fc(F.avg_pool2d(y, y.size(2))))
        return self.head(F.avg_pool2d(y, 4).flatten(1))


POOLS = [
    ({"kernel_size": 4}, 8),
    ({"kernel_size": 2, "stride": 2}, 7),
    ({"kernel_size": 3, "stride": 1, "padding": 1}, 6),
    ({"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}, 7),
    ({"kernel_size": 2, "stride": 2, "ceil_mode": True, "count_include_pad": False}, 7),  # ResNet-D
    ({"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, 8),
]


def _train_step(tmp_path, size: int) -> tuple[float, float]:
    """(loss, |gradient of the first conv|) of one training step on a batch of 3."""
    from onnxruntime.training import api

    art = tmp_path / "artifacts"
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
    module = api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
    x = np.random.default_rng(0).standard_normal((3, 3, size, size), dtype=np.float32)
    loss = float(module(x, np.ones((3, 2), np.float32))[0])
    return loss, float(np.abs(module.get_contiguous_parameters(trainable_only=True).numpy()).sum())


@pytest.mark.parametrize(("pool", "size"), POOLS, ids=[str(sorted(p.items())) for p, _ in POOLS])
def test_average_pool_becomes_the_conv_it_equals_and_trains(pool, size, tmp_path):
    torch.manual_seed(0)
    model = export(PoolNet(pool, size).eval(), (3, size, size))
    batchnorm.fix_batchnorm(model)
    trainable = ["conv.weight", "bn.weight", "bn.bias", "head.weight"]
    batchnorm.freeze_batchnorm(model, trainable)
    x = np.random.default_rng(1).standard_normal((5, 3, size, size)).astype(np.float32)
    before = run(model, x)
    assert pooling.average_pools_as_convs(model, trainable) == 1
    assert "AveragePool" not in {n.op_type for n in model.graph.node}
    np.testing.assert_allclose(run(model, x), before, rtol=1e-5, atol=1e-6)
    generate(model, trainable, tmp_path)
    loss, _ = _train_step(tmp_path, size)
    assert np.isfinite(loss)


def test_frozen_batchnorm_before_avg_pool_fails_without_the_rewrite(tmp_path):
    """The failure the rewrite removes: the gradient reaching the frozen BatchNorm's Mul is empty."""
    model = export(PoolNet({"kernel_size": 4}, 8).eval(), (3, 8, 8))
    batchnorm.fix_batchnorm(model)
    trainable = ["conv.weight", "bn.weight", "bn.bias", "head.weight"]
    batchnorm.freeze_batchnorm(model, trainable)
    generate(model, trainable, tmp_path)
    with pytest.raises(Exception, match="Can broadcast 0"):
        _train_step(tmp_path, 8)


def test_squeeze_excitation_gate_trains_after_the_rewrite(tmp_path):
    torch.manual_seed(0)
    model = export(SEGate(), (3, 8, 8))
    trainable = ["conv.weight", "fc.weight", "head.weight"]
    x = np.random.default_rng(1).standard_normal((4, 3, 8, 8)).astype(np.float32)
    before = run(model, x)
    assert pooling.average_pools_as_convs(model, trainable) == 2
    np.testing.assert_allclose(run(model, x), before, rtol=1e-5, atol=1e-6)
    generate(model, trainable, tmp_path)
    loss, _ = _train_step(tmp_path, 8)
    assert np.isfinite(loss)


def test_pools_off_the_gradient_path_stay():
    model = export(PoolNet({"kernel_size": 4}, 8).eval(), (3, 8, 8))
    assert pooling.average_pools_as_convs(model, ["head.weight"]) == 0
    assert "AveragePool" in {n.op_type for n in model.graph.node}
