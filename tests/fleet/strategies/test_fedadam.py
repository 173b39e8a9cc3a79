"""FedAdam (tasks.fleet.strategies.fedadam): Reddi et al.'s server Adam step, both moments kept per
tensor across rounds, and today's numerics bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.fleet.strategies import FedAdam
from tasks.recipe.extras import FleetSpec
from tests.fleet.strategies import recorded
from tests.fleet.strategies.kit import replay_frozen, replay_recorded

SPEC = FleetSpec(strategy="fedadam", server_lr=0.1, momentum=0.9, beta2=0.99, tau=1e-3)


def _w(a: float, b: float) -> dict[str, np.ndarray]:
    return {"a": np.full((2,), a, np.float32), "b": np.array([[b]], np.float32)}


def _by_hand(w: float, delta: float, m: float, v: float) -> tuple[float, float, float]:
    """One FedAdam step of one value: (new weight, m, v)."""
    m = 0.9 * m + 0.1 * delta
    v = 0.99 * v + 0.01 * delta**2
    return w + 0.1 * m / (np.sqrt(v) + 1e-3), m, v


def test_both_moments_carry_over_two_rounds_tensor_by_tensor():
    strategy = FedAdam(SPEC)
    w1 = strategy.aggregate(_w(0.0, 0.0), [(_w(2.0, -3.0), 1), (_w(2.0, -3.0), 4)])
    a1, ma, va = _by_hand(0.0, 2.0, 0.0, 0.0)  # m = 0.2, v = 0.04
    b1, mb, vb = _by_hand(0.0, -3.0, 0.0, 0.0)
    assert np.allclose(w1["a"], a1, rtol=1e-6) and np.allclose(w1["b"], b1, rtol=1e-6)
    assert np.allclose(strategy.m["a"], ma) and np.allclose(strategy.v["a"], va)
    assert np.allclose(strategy.m["b"], mb) and np.allclose(strategy.v["b"], vb)

    w2 = strategy.aggregate(w1, [(_w(1.0, 1.0), 3)])
    a1, b1 = float(w1["a"][0]), float(w1["b"][0, 0])  # the float32 weights round 2 starts from
    a2, ma, va = _by_hand(a1, 1.0 - a1, ma, va)
    b2, mb, vb = _by_hand(b1, 1.0 - b1, mb, vb)
    assert np.allclose(w2["a"], a2, rtol=1e-6) and np.allclose(w2["b"], b2, rtol=1e-6)
    assert np.allclose(strategy.m["a"], ma) and np.allclose(strategy.v["a"], va)
    assert np.allclose(strategy.m["b"], mb) and np.allclose(strategy.v["b"], vb)
    assert strategy.rounds == 2 and w2["a"].dtype == np.float32


def test_the_first_step_is_about_server_lr_whatever_the_delta():
    # m / sqrt(v) = 0.1 * d / (0.1 * |d|) = sign(d) in round 1: the step is ~server_lr (less tau)
    for d in (0.5, 20.0, -7.0):
        got = FedAdam(SPEC).aggregate(_w(0.0, 0.0), [(_w(d, d), 1)])
        assert np.allclose(got["a"], np.sign(d) * 0.1, rtol=0.03)


@pytest.mark.parametrize("case", recorded.cases("fedadam"))
def test_the_same_numbers_as_the_old_function_recorded(case):
    replay_recorded(FedAdam, case)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    "spec",
    [FleetSpec(strategy="fedadam"), SPEC, FleetSpec(strategy="fedadam", server_lr=0.03, beta2=0.9, tau=1e-6)],
)
def test_the_same_numbers_as_the_frozen_old_function(seed, spec):
    replay_frozen(FedAdam, spec, seed)
