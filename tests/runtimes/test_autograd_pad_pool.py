"""A zero Pad before a pool (a shake-shake shortcut's ``ZeroPad2d((1, 0, 1, 0))`` then
``AvgPool2d(1, stride=2)``): ONNX Runtime 1.19.2's PadFusion adds the Pad's amounts to the pool's
``pads``, which stops the session when a pad reaches the kernel and changes the values of a MaxPool
(-inf padding where the zeros were values) or of an AveragePool not counting its padding. The
autograd runtime's files keep such a pool out of that fusion (:func:`.onnx_passes.unfused_pads`),
the step trains with PyTorch's gradients, and a step ONNX Runtime cannot run is one line."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tasks.errors import ArtifactError
from tasks.prepare.runtimes.autograd.onnx_passes import unfused_pads, unfused_pads_proto
from tasks.prepare.runtimes.autograd.onnx_step import StepGraph, check_runs
from tests.runtimes.kit import assert_trains_like_pytorch, prepared_module

MODULE = """
import torch
from torch import nn


class ShakeShortcut(nn.Module):
    # a shake-shake ResNet's downsampling shortcut: two 1x1 paths, one shifted by a pixel
    def __init__(self, num_classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.shift, self.pool = nn.ZeroPad2d((1, 0, 1, 0)), nn.AvgPool2d(1, stride=2)
        self.a, self.b = nn.Conv2d(4, 4, 1, bias=False), nn.Conv2d(4, 4, 1, bias=False)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        shifted = self.pool(self.shift(h))[:, :, 1:, 1:]
        y = torch.cat([self.a(nn.functional.avg_pool2d(h, 1, 2)), self.b(shifted)], 1)
        return self.head(y.mean((2, 3)))
"""


def pad_pool(op: str, kernel: int, amounts: list[int], include: int) -> onnx.ModelProto:
    """``op(Pad(x, amounts, 0))`` on [1, 2, 6, 6], stride 2, the pool's ``pads`` all zero."""
    attrs = {"kernel_shape": [kernel, kernel], "strides": [2, 2], "pads": [0, 0, 0, 0]}
    if op == "AveragePool":
        attrs["count_include_pad"] = include
    inits = [numpy_helper.from_array(np.array([0, 0, amounts[0], amounts[1], 0, 0, amounts[2], amounts[3]],
                                              np.int64), "amounts"),
             numpy_helper.from_array(np.array(0, np.float32), "zero")]  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "amounts", "zero"], ["padded"]), helper.make_node(op, ["padded"], ["y"], **attrs)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def run(model: onnx.ModelProto, x: np.ndarray, optimised: bool) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    if not optimised:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x})[0]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["AveragePool", "MaxPool"]), st.integers(1, 3), st.lists(st.integers(0, 3), min_size=4, max_size=4),
       st.integers(0, 1), st.integers(0, 1000))  # fmt: skip
def test_a_pool_after_a_zero_pad_runs_as_written(op, kernel, amounts, include, seed):
    """Whatever the pool, kernel, amounts and divisor rule: after the pass, ONNX Runtime with all its
    optimisations computes what the graph says (its result with none), on negative values too."""
    model = pad_pool(op, kernel, amounts, include)
    x = -np.random.default_rng(seed).random((1, 2, 6, 6), dtype=np.float32)
    want = run(model, x, optimised=False)
    program = ir.serde.deserialize_model(model)
    unfused_pads(program)
    np.testing.assert_allclose(
        run(ir.serde.serialize_model(program), x, optimised=True), want, rtol=1e-6, atol=1e-6
    )
    proto = pad_pool(op, kernel, amounts, include)
    unfused_pads_proto(proto)
    np.testing.assert_allclose(run(proto, x, optimised=True), want, rtol=1e-6, atol=1e-6)


def test_without_the_pass_onnx_runtime_fails_or_differs():
    """The premise (ONNX Runtime 1.19.2): unguarded, a pad of the kernel's size stops the session
    and a MaxPool's result changes; with a fusion that is exact the pass keeps it."""
    x = -np.random.default_rng(0).random((1, 2, 6, 6), dtype=np.float32)
    with pytest.raises(Exception, match="Pad should be smaller than kernel"):
        run(pad_pool("AveragePool", 1, [1, 1, 0, 0], 1), x, optimised=True)
    model = pad_pool("MaxPool", 3, [1, 1, 1, 1], 0)
    assert not np.allclose(run(model, x, optimised=True), run(model, x, optimised=False))
    program = ir.serde.deserialize_model(pad_pool("AveragePool", 3, [1, 1, 1, 1], 1))
    assert unfused_pads(program) == 0


def test_a_step_onnx_runtime_cannot_run_is_one_line():
    x = np.random.default_rng(0).random((1, 2, 6, 6), dtype=np.float32)
    gm = torch.fx.symbolic_trace(
        lambda x: (torch.nn.functional.avg_pool2d(torch.nn.functional.pad(x, (1, 1, 0, 0)), 1, 2),)
    )
    step = StepGraph(gm, [("x", torch.from_numpy(x))], {"x"}, [], [], ["y"])
    with pytest.raises(ArtifactError) as caught:
        check_runs(step, pad_pool("AveragePool", 1, [1, 1, 0, 0], 1), [x], "train_step.onnx")
    message = str(caught.value)
    assert message.startswith("train_step.onnx does not run in ONNX Runtime: ") and "ort-training" in message
    assert "\n" not in message and ".h:" not in message and "Pad should be smaller than kernel" in message


def test_a_shake_shake_shortcut_trains_with_pytorch_gradients(tmp_path):
    recipe, prepared = prepared_module(
        tmp_path, "shake", MODULE, {"model": {"callable": "shake:ShakeShortcut"}}
    )
    assert_trains_like_pytorch(recipe, prepared)
