"""A step's orders (sort, top-k, argmax), decisions (a ReLU's mask) and its check against the traced
graph: ONNX Runtime's order or decision of near-tied values is taken, any other is not, the step file
keeps only its own outputs, and a result beyond the check's bound passes only as float32 rounding, as
close to the step in float64 as PyTorch's own (tasks/prepare/runtimes/autograd/discrete.py,
onnx_step.check_runs)."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from torch.fx.experimental.proxy_tensor import make_fx

from tasks.errors import ArtifactError
from tasks.prepare.runtimes.autograd import decompositions
from tasks.prepare.runtimes.autograd.discrete import (
    Orders,
    eager_pinned,
    order_name,
    order_nodes,
    run_pinned,
    slack,
)
from tasks.prepare.runtimes.autograd.onnx_step import RTOL, WIDE, StepGraph, check_runs, export_step


def mining(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A hard-negative-mining loss (as SSD's): the 3 largest of each row of x * w, chosen by rank."""
    y = x * w
    with torch.no_grad():
        rank = y.argsort(1, descending=True).argsort(1)
    return (y * (rank < 3)).sum() + (y * y).mean()


@functools.cache
def traced(batch: int = 4, mode: str = "real") -> torch.fx.GraphModule:
    """The train step of :func:`mining`: (x, w) -> (loss, its gradient in w)."""

    def step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grad, loss = torch.func.grad_and_value(lambda t: mining(x, t))(w)
        return loss, grad

    return make_fx(step, tracing_mode=mode)(torch.rand(batch, 9), torch.rand(9))


def torch_order(y: np.ndarray) -> np.ndarray:
    return torch.from_numpy(y).argsort(1, descending=True).numpy()


def other_tie_order(y: np.ndarray) -> np.ndarray:
    """A descending order of ``y`` that breaks ties by the highest index first."""
    return np.stack([np.lexsort((-np.arange(len(r)), -r)) for r in y])


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=36, max_size=36), st.integers(0, 1000))
def test_a_near_tie_order_is_taken_and_gives_the_loss_of_that_choice(levels, seed):
    x = torch.tensor(levels, dtype=torch.float32).reshape(4, 9)  # few levels: many ties
    w = torch.ones(9) + torch.from_numpy(np.random.default_rng(seed).normal(0, 1e-7, 9).astype(np.float32))
    gm = traced()
    (first,) = [n for n in order_nodes(gm) if n.args[0].args[1:] == (1, True)]
    y = (x * w).numpy()
    theirs = other_tie_order(x.numpy())  # sorts y up to its 1e-7 perturbation
    got, differed = run_pinned(gm, [x, w], {order_name(first): theirs}, RTOL)
    assert slack(first, y, torch_order(y), theirs) <= RTOL
    rank = np.argsort(theirs, 1)
    chosen = torch.from_numpy(rank < 3)
    want = torch.func.grad_and_value(lambda t: ((x * t) * chosen).sum() + ((x * t) ** 2).mean())(w)
    assert differed == ([] if np.array_equal(theirs, torch_order(y)) else [first.name])
    torch.testing.assert_close(got[0], want[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[1], want[0], rtol=1e-6, atol=1e-6)


def test_an_order_that_is_no_near_tie_is_not_taken():
    x, w = torch.arange(36, dtype=torch.float32).reshape(4, 9), torch.ones(9)
    gm = traced()
    (first,) = [n for n in order_nodes(gm) if n.args[0].args[1:] == (1, True)]
    ascending = np.argsort(x.numpy(), 1)  # the reverse order: far from sorting descending
    got, differed = run_pinned(gm, [x, w], {order_name(first): ascending}, RTOL)
    assert differed == []
    want = gm(x, w)
    torch.testing.assert_close(got[0], want[0])


def test_infinities_a_mask_wrote_are_a_tie_of_an_order():
    """SSD's mining as the wiki writes it puts -inf into the positives' losses before its sort: ONNX
    Runtime may rank those -inf in another order than PyTorch, which is a tie (their difference was
    NaN, so the near-tie order was not taken at all and the traced step failed its check by 0.4 %)."""
    gm = traced()
    (first,) = [n for n in order_nodes(gm) if n.args[0].args[1:] == (1, True)]
    y = np.array([[-np.inf, 2.0, -np.inf, 1.0, 1.0 + 1e-7, 5.0, 3.0, -np.inf, 4.0]], np.float32)
    ours = torch_order(y)
    theirs = other_tie_order(np.where(np.isfinite(y), np.round(y, 3), y))  # the -inf and the 1s the other way
    assert not np.array_equal(ours, theirs)
    assert slack(first, y, ours, theirs) <= RTOL
    inf_first = np.concatenate([theirs[:, -1:], theirs[:, :-1]], 1)  # an -inf ranked above 5: no tie
    assert slack(first, y, ours, inf_first) == np.inf


def mined(x: torch.Tensor) -> torch.Tensor:
    """The third largest value (``sort``) and the largest three by rank (``argsort`` twice)."""
    rank = x.argsort(1, descending=True).argsort(1)
    return x.sort(1, descending=True).values[:, 2].sum() + (x * (rank < 3)).sum()


@pytest.mark.parametrize("kind", ["near-tie", "no-tie", "other-shape"])
def test_a_graph_step_s_check_takes_onnx_runtime_s_near_tie_orders(kind):
    """PyTorch's eager step for a graph step's check: its n-th sort, argsort or topk takes the n-th
    TopK's indices where those are a near-tie order of its values, and autograd follows them (the
    wiki's SSD-Lite: a few priors mined otherwise, 1e-2 of a head's gradient); another order, or
    one of another shape, is not taken."""
    x = torch.tensor([[3.0, 1.0, 1.0 + 1e-7, 2.0, 0.5]], requires_grad=True)
    ours = torch_order(x.detach().numpy())  # [0, 3, 2, 1, 4]
    theirs = {"near-tie": np.array([[0, 3, 1, 2, 4]]), "no-tie": np.array([[0, 1, 3, 2, 4]]),
              "other-shape": np.array([[0, 3, 1, 2]])}[kind]  # fmt: skip
    # the TopKs in the order of the calls: the argsort, the argsort of its result, the sort
    orders = Orders([theirs, np.argsort(theirs, 1), theirs])
    with eager_pinned(orders, RTOL):
        (grad,) = torch.autograd.grad(mined(x), x)
    chosen = theirs[0] if kind == "near-tie" else ours[0]
    want = np.zeros(5, np.float32)
    want[chosen[:3]] += 1.0
    want[chosen[2]] += 1.0
    assert orders.pinned == ([0, 2] if kind == "near-tie" else [])
    np.testing.assert_array_equal(grad.numpy()[0], want)


def test_argmax_near_tie():
    def f(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.zeros_like(x).scatter(1, x.argmax(1, keepdim=True), 1.0).sum(0),)

    gm = make_fx(f)(torch.rand(2, 3))
    (node,) = order_nodes(gm)
    x = torch.tensor([[1.0, 1.0 + 1e-7, 0.0], [0.0, 2.0, 1.0]])
    got, differed = run_pinned(gm, [x], {order_name(node): np.array([[0], [1]])}, RTOL)
    assert differed == [node.name] and got[0].tolist() == [1.0, 1.0, 0.0]
    got, differed = run_pinned(gm, [x], {order_name(node): np.array([[2], [1]])}, RTOL)
    assert differed == [] and got[0].tolist() == [0.0, 2.0, 0.0]


def test_the_step_file_is_checked_with_its_orders_and_keeps_only_its_outputs(tmp_path):
    gm = traced(7, "symbolic")  # the batch a symbol, as the steps are traced
    x = torch.tensor(np.random.default_rng(0).integers(0, 3, (7, 9)), dtype=torch.float32)
    step = StepGraph(gm, [("x", x), ("w", torch.ones(9))], {"x"}, [], [], ["loss", "w_grad"])
    export_step(step, tmp_path / "step.onnx")
    model = onnx.load(str(tmp_path / "step.onnx"))
    assert [o.name for o in model.graph.output] == ["loss", "w_grad"]
    negated = onnx.load(str(tmp_path / "step.onnx"))  # a step computing another gradient is refused
    (node,) = [n for n in negated.graph.node if "w_grad" in n.output]
    node.output[list(node.output).index("w_grad")] = "w_grad_before"
    negated.graph.node.append(onnx.helper.make_node("Neg", ["w_grad_before"], ["w_grad"]))
    with pytest.raises(ArtifactError, match="output 'w_grad' computed by ONNX Runtime differs"):
        check_runs(step, negated, [x.numpy(), np.ones(9, np.float32)], "step.onnx")


@functools.cache
def relu_head() -> torch.fx.GraphModule:
    """SelecSLS-42's head shrunk: a 1x1 conv on a 1x1 map (a matrix product) -> ReLU -> a linear
    layer; the step (loss, the conv weight's gradient), traced with the runtime's decompositions
    (ReLU's backward is the mask ``relu(x) > 0``, a decision)."""

    def step(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grad, loss = torch.func.grad_and_value(lambda t: (torch.relu(x @ t) @ v).sum())(w)
        return loss, grad

    return make_fx(step, decomposition_table=decompositions.table())(
        torch.rand(4, 3), torch.rand(3, 5), torch.rand(5)
    )


def the_mask(gm: torch.fx.GraphModule) -> torch.fx.Node:
    (node,) = order_nodes(gm)
    assert node.target is torch.ops.aten.gt.Scalar and node.args[0].target is torch.ops.aten.relu.default
    return node


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(-1, 1), min_size=12, max_size=12), st.integers(0, 1000))
def test_a_near_tie_decision_is_taken_and_gives_the_gradient_of_that_mask(levels, seed):
    """The ReLU inputs are integers up to a 1e-7 perturbation (many at 0): ONNX Runtime's mask, from
    other roundings of the same inputs, is taken, and the step is the one that mask makes."""
    rng = np.random.default_rng(seed)
    x = torch.tensor(levels, dtype=torch.float32).reshape(4, 3)
    w = torch.ones(3, 5) + torch.from_numpy(rng.normal(0, 1e-7, (3, 5)).astype(np.float32))
    v = torch.from_numpy(rng.normal(0, 1, 5).astype(np.float32))
    gm, node = relu_head(), the_mask(relu_head())
    other = x.numpy() @ (np.ones((3, 5)) + rng.normal(0, 1e-7, (3, 5)))  # ONNX Runtime's rounding
    theirs = other > 0
    got, differed = run_pinned(gm, [x, w, v], {order_name(node): theirs}, RTOL)
    assert differed == ([] if np.array_equal(theirs, (x @ w).numpy() > 0) else [node.name])
    chosen = torch.from_numpy(theirs).float()
    torch.testing.assert_close(got[1], x.T @ (chosen * v), rtol=1e-6, atol=1e-6)


def test_a_decision_that_is_no_near_tie_is_not_taken():
    """ONNX Runtime's mask passing a sample whose ReLU input is -1 (a wrong mask, not a rounding):
    PyTorch's is kept, whatever the ReLU's output (0 there) would allow."""
    x, w, v = (
        torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
        torch.ones(3, 5),
        torch.ones(5),
    )
    gm, node = relu_head(), the_mask(relu_head())
    theirs = np.ones((4, 5), dtype=bool)
    got, differed = run_pinned(gm, [x, w, v], {order_name(node): theirs}, RTOL)
    assert differed == [] and torch.equal(got[1], gm(x, w, v)[1])


def cancelling(offset: float) -> torch.fx.GraphModule:
    """``(x + offset) - offset``: float32 loses the bits of x below offset's last one (as a deep
    model's rounding grows: ConvMixer-768/32's 32 blocks took its output 1.3e-3 from float64)."""
    return make_fx(lambda x: ((x + offset) - offset,))(torch.rand(64))


def onnx_of(offset: float, scale: float) -> onnx.ModelProto:
    """ONNX Runtime's side: ``((x - offset) + offset) * scale`` (other roundings of the same value)."""
    c = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("c", offset), ("s", scale))]
    nodes = [helper.make_node("Sub", ["x", "c"], ["a"]), helper.make_node("Add", ["a", "c"], ["b"]),
             helper.make_node("Mul", ["b", "s"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])], c)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([4096.0, 16384.0]), st.integers(0, 1000))
def test_float32_rounding_is_told_from_a_wrong_result_by_the_step_in_float64(offset, seed):
    """ONNX Runtime's result beyond RTOL of PyTorch's float32 is accepted when it is as close to the
    step in float64 as PyTorch's own (other roundings), refused when it is farther (a 1 % error)."""
    x = np.random.default_rng(seed).random(64, dtype=np.float32)
    step = StepGraph(cancelling(offset), [("x", torch.from_numpy(x))], {"x"}, [], [], ["y"])
    assert check_runs(step, onnx_of(offset, 1.0), [x], "step.onnx") > RTOL
    with pytest.raises(ArtifactError, match="from that step in float64 by"):
        check_runs(step, onnx_of(offset, 1.01), [x], "step.onnx")


def scaled_onnx(scale: float) -> onnx.ModelProto:
    """ONNX Runtime's side of ``x * 1``: ``x * scale`` (a result ``scale - 1`` from float64)."""
    c = [helper.make_tensor("s", TensorProto.FLOAT, [], [scale])]
    graph = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])], c)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@settings(max_examples=10, deadline=None)
@given(st.floats(1.1e-4, 9e-4), st.integers(0, 1000))
def test_a_step_pytorch_computes_exactly_is_judged_by_float64(error, seed):
    """PyTorch's float32 equal to float64 (IGCV3's grouped convolutions left the loss 1.32e-4 from
    ONNX Runtime's, both within 1.2e-4 of float64): ONNX Runtime's result beyond RTOL but within
    WIDE of float64 is accepted, a 1 % error still refused."""
    x = 1 + np.random.default_rng(seed).random(64, dtype=np.float32)
    step = StepGraph(make_fx(lambda x: (x * 1.0,))(torch.from_numpy(x)), [("x", torch.from_numpy(x))], {"x"}, [],
                     [], ["y"])  # fmt: skip
    assert RTOL < check_runs(step, scaled_onnx(1 + error), [x], "step.onnx") <= WIDE
    with pytest.raises(ArtifactError, match=r"from that step in float64 by 0\.01"):
        check_runs(step, scaled_onnx(1.01), [x], "step.onnx")
