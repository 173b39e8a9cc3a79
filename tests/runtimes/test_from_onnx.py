"""The PyTorch twin of an ONNX graph (tasks.prepare.runtimes.autograd.from_onnx): which torch tensors
hold an initializer comes from the converter's node inputs; a tensor the converter holds transformed
is refused as trainable in one line; an initializer two nodes read is held twice and its gradient in
the traced train step is the sum of both uses, as PyTorch's autograd gives it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tasks.errors import RecipeError
from tasks.prepare.runtimes.autograd.from_onnx import torch_twin
from tasks.prepare.runtimes.autograd.trace import StepInputs, forward_graph, trace_step


def _model(nodes, inits: dict[str, np.ndarray], width: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_gemm_without_trans_b_keeps_its_weight_transposed_so_it_cannot_train():
    rng = np.random.default_rng(0)
    inits = {"W": rng.standard_normal((4, 3)), "B": rng.standard_normal(3)}
    model = _model([helper.make_node("Gemm", ["x", "W", "B"], ["y"], name="fc", transB=0)], inits, 4)
    twin, held = torch_twin(model, ["B"])  # its bias is held as it is
    assert held == {"B": ["fc.bias"]}
    x = rng.standard_normal((2, 4)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(twin(torch.from_numpy(x)).numpy(), x @ inits["W"] + inits["B"], atol=1e-5)
    with pytest.raises(RecipeError, match=r"^recipe field 'trainable': .* holds as they are .*\(got 'W'\)$"):
        torch_twin(model, ["W"])


def test_a_weight_one_of_its_readers_holds_transposed_cannot_train():
    """A MatMul holds it as it is, a Gemm with transB=0 transposed: training only one would be wrong."""
    w = np.random.default_rng(2).standard_normal((4, 4))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="first"),
             helper.make_node("Gemm", ["h", "W"], ["y"], name="second", transB=0)]  # fmt: skip
    with pytest.raises(RecipeError, match=r"^recipe field 'trainable': .*\(got 'W'\)$"):
        torch_twin(_model(nodes, {"W": w}, 4), ["W"])


def test_an_initializer_two_nodes_read_trains_with_the_sum_of_their_gradients():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="first"),
             helper.make_node("MatMul", ["h", "W"], ["y"], name="second")]  # fmt: skip
    twin, held = torch_twin(_model(nodes, {"W": w}, 4), ["W"])
    assert len(held["W"]) == 2  # one buffer per use
    x = torch.from_numpy(rng.standard_normal((7, 4)).astype(np.float32))
    forward = forward_graph(twin, (x,), True, "frozen", 1, None)
    tensors = {**dict(forward.named_parameters()), **dict(forward.named_buffers())}
    frozen = {n: t for n, t in tensors.items() if n not in held["W"]}
    step = StepInputs(
        [("x", x)], 1, {"W": torch.from_numpy(w)}, frozen, lambda out, _: (out[0].square().sum(), ()), held
    )
    loss, grad = trace_step(forward, step, grads=True)(x, torch.from_numpy(w), *frozen.values())
    want = torch.from_numpy(w).requires_grad_()
    expected = ((x @ want) @ want).square().sum()
    expected.backward()
    assert torch.allclose(loss, expected.detach(), rtol=1e-5)
    assert torch.allclose(grad, want.grad, rtol=1e-5, atol=1e-5)
