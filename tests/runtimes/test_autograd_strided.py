"""A forward that restrides a tensor (``as_strided``: here an adaptive 1d pool's output, Swin's
pooler) has a backward the exporter writes as ``as_strided_scatter``: the autograd runtime writes it
as a scatter over the flat input (:mod:`tasks.prepare.runtimes.autograd.strided`), equal to
PyTorch's kernel on every view of a contiguous tensor, and such a model trains with PyTorch's
loss and gradients."""

from __future__ import annotations

import json

import pytest
import torch

from tasks.prepare.runtimes.autograd.op_checks import TensorArg, Use, check_use
from tasks.prepare.runtimes.autograd.strided import as_strided_scatter
from tests.runtimes.kit import assert_trains_like_pytorch, prepared_module

aten = torch.ops.aten
MODULE = """
from torch import nn


class Pooled1d(nn.Module):
    # tokens pooled by AdaptiveAvgPool1d over their transpose, as Swin's pooler does

    def __init__(self, num_classes=3):
        super().__init__()
        self.conv, self.mix, self.pool = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4, 4), nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(4, num_classes)

    def forward(self, x):
        tokens = self.mix(self.conv(x).relu().flatten(2).transpose(1, 2))
        return self.head(self.pool(tokens.transpose(1, 2)).flatten(1))
"""


@pytest.mark.parametrize(
    ("base", "size", "stride", "offset"),
    [
        ([6, 5], [6, 5], [5, 1], 0),  # the whole tensor
        ([4, 6], [3, 2], [6, 2], 1),  # every other column, shifted
        ([2, 3, 4], [4, 3, 2], [1, 4, 12], 0),  # a transposed view
        ([5, 1, 1], [5, 1, 1], [1, 5, 5], 0),  # size-1 axes with any stride (a pool's output)
        ([10], [3, 3], [2, 1], 2),  # overlapping-free windows of a vector
    ],
)
def test_as_strided_scatter_equals_pytorch(base, size, stride, offset):
    gen = torch.Generator().manual_seed(0)
    inp, src = torch.randn(base, generator=gen), torch.randn(size, generator=gen)
    want = aten.as_strided_scatter(inp, src, size, stride, offset)
    assert torch.equal(as_strided_scatter(inp, src, size, stride, offset), want)
    use = Use(aten.as_strided_scatter.default, (TensorArg(tuple(base), torch.float32),
                                                TensorArg(tuple(size), torch.float32), tuple(size), tuple(stride), offset))  # fmt: skip
    assert check_use(use) == 0.0


def test_a_non_contiguous_input_is_left_to_pytorch():
    inp = torch.randn(4, 6).t()
    assert as_strided_scatter(inp, torch.randn(2, 2), [2, 2], [1, 4], 0) is NotImplemented


def test_a_restrided_forward_trains_with_pytorch_gradients(tmp_path, traced_steps):
    recipe, prepared = prepared_module(tmp_path, "pooled", MODULE, {"model": {"callable": "pooled:Pooled1d"}})
    manifest = json.loads((prepared.artifacts_dir.parent / "manifest.json").read_text())
    assert any(k.startswith("aten.as_strided_scatter") for k in manifest["decompositions_checked"])
    assert_trains_like_pytorch(recipe, prepared)


class _Plain(torch.nn.Module):
    def forward(self, x):
        return torch.mm(x, torch.ones(4, 3)).relu()


class _Composite(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.linear(x, torch.ones(3, 4)).to(torch.float64)  # kept by the export's IR


class _WritesThroughStrides(torch.nn.Module):
    def forward(self, x):
        out = torch.zeros(x.shape[0] * 4)
        out.as_strided((x.shape[0], 2), (4, 2)).copy_(x[:, :2])  # what a restrided backward does
        return out


@pytest.mark.parametrize(
    ("module", "expected"), [(_Plain(), False), (_Composite(), True), (_WritesThroughStrides(), True)]
)
def test_the_own_decompositions_run_only_where_they_can_change_the_step(module, expected):
    """The decomposition pass before the exporter (a whole re-trace; the exporter's own is skipped)
    runs on a program that holds a mutable operator, a composite one or one of the table's, and is
    skipped on one that cannot need it."""
    from tasks.prepare.runtimes.autograd.onnx_step import export_table, rewrites_with

    exported = torch.export.export(module, (torch.randn(3, 4),), strict=False)
    assert rewrites_with(exported, export_table()) is expected
    if expected:
        ops = {str(n.target) for n in exported.run_decompositions(export_table()).graph.nodes}
        assert not any("as_strided_scatter" in op for op in ops)  # ours: a scatter over the flat input
