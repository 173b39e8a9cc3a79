"""The activations' near-ties in the graph step's check (:mod:`tasks.prepare.runtimes.autograd.graph_decisions`):
where ONNX Runtime's float32 forward puts a ReLU's, a ReLU6's, a hardtanh's or a clamp's input on the
other side of a bound than PyTorch's does by rounding, PyTorch's step takes ONNX Runtime's decision
for the check; a decision that is no near-tie is PyTorch's own, so a wrong mask still fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tasks.prepare.runtimes.autograd.graph_decisions import Decisions, pinned
from tasks.prepare.runtimes.autograd.graph_step import _eager
from tasks.prepare.runtimes.autograd.onnx_step import RTOL
from tasks.prepare.runtimes.autograd.trace import StepInputs
from tests.runtimes.test_graph_step import _ce, _written

nn = torch.nn


class _Clamp(nn.Module):
    def forward(self, x):
        return x.clamp(min=0.0)


class _Relu(nn.Module):  # the functional form, in place
    def forward(self, x):
        return torch.relu_(x * 1.0)


ACTS = {"relu": (nn.ReLU, 0.0), "relu-inplace": (lambda: nn.ReLU(inplace=True), 0.0),
        "relu6": (lambda: nn.ReLU6(inplace=True), 0.0), "hardtanh": (lambda: nn.Hardtanh(-0.5, 0.5), -0.5),
        "clamp": (_Clamp, 0.0), "relu_": (_Relu, 0.0)}  # fmt: skip


def _planted(acts: list[str], channels: int, size: int, x: torch.Tensor, at: list[int]) -> nn.Module:
    """Convolution, BatchNorm and activation blocks whose statistics put one element of each channel
    on the activation's lower bound (a calibrated BatchNorm centres a channel on 0: a large model
    has such elements by the million), then a linear head."""
    layers, h, cin = [], x, x.shape[1]
    for k, act in enumerate(acts):
        conv, norm = nn.Conv2d(cin, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        with torch.no_grad():
            c = conv(h)
            n, i, j = (at[k] + np.arange(3)) % [len(x), size, size]
            norm.running_mean.copy_(c[n, :, i, j])
            norm.running_var.copy_(c.var((0, 2, 3)))
            norm.bias.fill_(ACTS[act][1])
            block = nn.Sequential(conv, norm.eval(), ACTS[act][0]())
            h = block(h)
        layers.append(block)
        cin = channels
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * size * size, 3))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(acts=st.lists(st.sampled_from(sorted(ACTS)), min_size=1, max_size=3), channels=st.sampled_from([4, 8]),
       size=st.sampled_from([4, 6]), seed=st.integers(0, 7), at=st.lists(st.integers(0, 50), min_size=3, max_size=3))  # fmt: skip
@example(acts=["relu6"], channels=8, size=4, seed=3, at=[0, 0, 0])  # the shrunk failures before the pinning
@example(acts=["hardtanh"], channels=4, size=4, seed=1, at=[1, 0, 0])
@example(acts=["clamp"], channels=8, size=4, seed=3, at=[0, 0, 0])  # clamp's gradient passes at its bound
def test_generated_near_ties_of_activations_leave_the_graph_step(tmp_path, acts, channels, size, seed, at):
    """Without ONNX Runtime's near-tie decisions, a flipped element's gradient reaches the earlier
    layers and the graph step is Unsupported (the model goes to the traced step): 0.07-0.08 of the
    first convolution's weight gradient for one ReLU6 or hardtanh, PyTorch float32's own distance
    from float64 0.01-0.03."""
    torch.manual_seed(seed)
    x = torch.randn(5, 3, size, size)
    model = _planted(acts, channels, size, x, at)
    _written(tmp_path, model, x, 3)  # Unsupported: 'differs from PyTorch's autograd by ...'


def _step(model, x, y):
    params = dict(model.named_parameters())
    return StepInputs([("input", x), ("labels", y)], 1, {n: p.detach() for n, p in params.items()}, {}, _ce)


@pytest.mark.parametrize("kind", ["relu", "relu6", "clamp"])
def test_only_a_near_tie_takes_onnx_runtime_s_decision(kind):
    """ONNX Runtime's input of the activation on the other side of the bound: within RTOL of the
    largest |value| it decides the element's gradient, beyond it PyTorch's own decision stands."""
    act = {"relu": nn.ReLU(), "relu6": nn.ReLU6(inplace=True), "clamp": _Clamp()}[kind]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), act, nn.Linear(6, 3))
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    scale = max(1.0, float(model[0](x).detach().abs().max()))
    for gap, taken in ((0.5 * RTOL * scale, True), (10 * RTOL * scale, False)):
        with torch.no_grad():  # sample 2's input of unit 3 ``gap`` above 0 in PyTorch, below in ONNX Runtime
            model[0].bias[3] -= model[0](x)[2, 3] - gap
            theirs = model[0](x).numpy()
        theirs[2, 3] = -gap
        plain = _eager(model, _step(model, x, y), [], True)
        decisions = Decisions(["Clip" if kind != "relu" else "Relu"], [theirs])
        got = _eager(model, _step(model, x, y), [], True, decisions)
        assert decisions.matched and decisions.pinned == int(taken)
        first = got[2]  # the first layer's weight gradient: row 3 carries the element's gradient
        assert np.allclose(np.delete(first, 3, 0), np.delete(plain[2], 3, 0), atol=1e-6)
        assert np.allclose(first[3], plain[2][3], atol=1e-6) is not taken


def test_calls_that_do_not_pair_up_with_the_nodes_pin_nothing():
    """A graph whose decision nodes are not the model's calls, one to one by kind and shape (the
    exporter merged two equal calls): PyTorch's step is its own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    plain = _eager(model, _step(model, x, y), [], True)
    for kinds, shape in ((["Clip"], (5, 6)), (["Relu"], (5, 7)), (["Relu", "Relu"], (5, 6))):
        flipped = -np.ones(shape, np.float32) * 1e-9  # every element decided otherwise at a tie
        decisions = Decisions(kinds, [flipped] * len(kinds))
        got = _eager(model, _step(model, x, y), [], True, decisions)
        assert not decisions.matched
        assert all(np.array_equal(a, b) for a, b in zip(got, plain, strict=True))
    with pinned(None, RTOL):  # no decisions: nothing intercepted
        assert torch.relu(torch.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]
