"""ONNX Runtime 1.19.2's ScatterND with ``reduction="add"`` spreads its updates over threads and
loses the ones of one index added on two threads at once; an ``index_put`` with ``accumulate`` (the
backward of an indexing, of smp's FPN's bilinear upsampling as PyTorch decomposes it, of an
embedding) exported so gave that FPN's GroupNorm bias gradient 0.0226 apart between two runs. The
autograd runtime writes each as a ScatterElements along one flat axis
(:func:`.onnx_passes.serial_scatter_adds`), which adds serially."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from tasks.prepare.runtimes.autograd.onnx_passes import serial_scatter_adds
from tests.runtimes.kit import assert_trains_like_pytorch, prepared_module


def scatter_add(shape: list[int], k: int, count: int) -> onnx.ModelProto:
    """``ScatterND(data, indices [count, k], updates, reduction="add")`` on ``data`` of ``shape``,
    through an Identity (its shape unknown to the pass, as an exported step's intermediates)."""
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["data"], ["through"]),
            helper.make_node("ScatterND", ["through", "indices", "updates"], ["out"], reduction="add"),
        ],
        "g",
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("indices", TensorProto.INT64, [count, k]),
            helper.make_tensor_value_info("updates", TensorProto.FLOAT, [count, *shape[k:]]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    program = ir.serde.deserialize_model(model)
    assert serial_scatter_adds(program) == 1
    out = ir.serde.serialize_model(program)
    assert [n.op_type for n in out.graph.node].count("ScatterND") == 0
    return out


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data(), st.integers(0, 1000))
def test_a_scatter_add_is_numpy_add_at(shape, data, seed):
    """Any rank, any number of indexed axes, duplicate and negative indices: the rewritten graph
    adds every update, as ``np.add.at``."""
    k = data.draw(st.integers(1, len(shape)))
    count = data.draw(st.integers(1, 40))
    rng = np.random.default_rng(seed)
    indices = np.stack([rng.integers(-d, d, count) for d in shape[:k]], axis=-1).astype(np.int64)
    updates = rng.standard_normal((count, *shape[k:])).astype(np.float32)
    base = rng.standard_normal(shape).astype(np.float32)
    want = base.astype(np.float64).copy()
    np.add.at(want, tuple(indices.T), updates)
    (got,) = session(rewritten(scatter_add(shape, k, count))).run(
        None, {"data": base, "indices": indices, "updates": updates}
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_many_updates_of_few_rows_are_all_added():
    """64 updates of each of 16 rows of 4 096 values, shuffled: every run sums all of them (ONNX
    Runtime's ScatterND, on more than one thread, loses some)."""
    rows, dup, width = 16, 64, 4096
    indices = np.random.default_rng(0).permutation(np.repeat(np.arange(rows), dup))[:, None].astype(np.int64)
    feeds = {"data": np.zeros((rows, width), np.float32), "indices": indices,
             "updates": np.ones((rows * dup, width), np.float32)}  # fmt: skip
    run = session(rewritten(scatter_add([rows, width], 1, rows * dup)))
    for _ in range(10):
        assert np.array_equal(run.run(None, feeds)[0], np.full((rows, width), dup, np.float32))


MODULE = """
import torch
from torch import nn


class Upsampling(nn.Module):
    # an FPN segmentation block shrunk: conv, GroupNorm, ReLU, bilinear x2 (align_corners), nearest x2
    def __init__(self, num_classes=3):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.GroupNorm(2, 8)
        self.mix, self.head = nn.Conv2d(8, 4, 3, padding=1), nn.Linear(4, num_classes)

    def forward(self, x):
        y = torch.relu(self.norm(self.conv(x)))
        y = nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=True)
        y = nn.functional.interpolate(self.mix(y), scale_factor=2.0, mode="nearest")
        return self.head(y.mean((2, 3)))
"""


def test_an_upsampling_block_trains_with_pytorch_gradients_and_no_scatter_nd(tmp_path):
    recipe, prepared = prepared_module(
        tmp_path, "upsampling", MODULE, {"model": {"callable": "upsampling:Upsampling"}}
    )
    step_file = prepared.artifacts_dir / "train_step.onnx"
    assert "ScatterND" not in {n.op_type for n in onnx.load(str(step_file)).graph.node}
    assert_trains_like_pytorch(recipe, prepared, session(onnx.load(str(step_file))))
