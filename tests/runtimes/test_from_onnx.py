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


def _model(nodes, inits: dict[str, np.ndarray], width: int | list[int]) -> onnx.ModelProto:
    shape = ["batch", *(width if isinstance(width, list) else [width])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
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


def test_a_reshape_to_a_shape_the_graph_computes_traces_with_a_symbolic_batch():
    """``x.view(x.size(0), -1)`` as the TorchScript exporter writes it (Shape, Gather, Unsqueeze,
    Concat, Reshape): the twin reshapes to the measured [-1, 6], and the step traces at any batch."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 2)).astype(np.float32)
    consts = {"zero": np.array(0), "minus_one": np.array([-1]), "axes": np.array([0])}
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["b"]),
             helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
             helper.make_node("Concat", ["b1", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]),
             helper.make_node("MatMul", ["flat", "W"], ["y"], name="fc")]  # fmt: skip
    graph = _model(nodes, {"W": w}, [2, 3])
    for name, value in consts.items():
        graph.graph.initializer.append(numpy_helper.from_array(value.astype(np.int64), name))
    twin, held = torch_twin(graph, ["W"])
    for batch in (5, 2):
        x = torch.from_numpy(rng.standard_normal((batch, 2, 3)).astype(np.float32))
        forward = forward_graph(twin, (x,), True, "frozen", 1, None)
        tensors = {**dict(forward.named_parameters()), **dict(forward.named_buffers())}
        frozen = {n: t for n, t in tensors.items() if n not in held["W"]}
        loss_fn = lambda out, _: (out[0].square().sum(), ())  # noqa: E731
        step = StepInputs([("x", x)], 1, {"W": torch.from_numpy(w)}, frozen, loss_fn, held)
        loss, grad = trace_step(forward, step, grads=True)(x, torch.from_numpy(w), *frozen.values())
        want = torch.from_numpy(w).requires_grad_()
        expected = (x.reshape(batch, -1) @ want).square().sum()
        expected.backward()
        assert torch.allclose(loss, expected.detach(), rtol=1e-5)
        assert torch.allclose(grad, want.grad, rtol=1e-5, atol=1e-5)
