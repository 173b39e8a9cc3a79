"""A step's orders (sort, top-k, argmax) and its check against the traced graph: ONNX Runtime's
order of near-tied values is taken, any other order is not, and the step file keeps only its
own outputs (tasks/prepare/runtimes/autograd/discrete.py, onnx_step.check_runs)."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from tasks.errors import ArtifactError
from tasks.prepare.runtimes.autograd.discrete import order_name, order_nodes, run_pinned, slack
from tasks.prepare.runtimes.autograd.onnx_step import RTOL, StepGraph, check_runs, export_step


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
