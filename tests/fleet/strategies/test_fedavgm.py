"""FedAvgM (tasks.fleet.strategies.fedavgm): server momentum kept per tensor across rounds, and
today's numerics bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.fleet.strategies import FedAvgM
from tasks.recipe.extras import FleetSpec
from tests.fleet.strategies import recorded
from tests.fleet.strategies.kit import replay_frozen, replay_recorded


def _w(a: float, b: float) -> dict[str, np.ndarray]:
    return {"a": np.full((2,), a, np.float32), "b": np.array([[b]], np.float32)}


def test_momentum_accumulates_across_two_rounds_tensor_by_tensor():
    strategy = FedAvgM(FleetSpec(strategy="fedavgm", server_lr=1.0, momentum=0.5))
    # round 1: delta = mean - w = (1, -2) = m -> w = (1, -2)
    w1 = strategy.aggregate(_w(0.0, 0.0), [(_w(0.0, -4.0), 1), (_w(2.0, 0.0), 1)])
    assert np.allclose(w1["a"], 1.0) and np.allclose(w1["b"], -2.0)
    assert np.allclose(strategy.m["a"], 1.0) and np.allclose(strategy.m["b"], -2.0)
    # round 2: delta = (2, -1) - (1, -2) = (1, 1); m = 0.5 * (1, -2) + (1, 1) = (1.5, 0) -> w = (2.5, -2)
    w2 = strategy.aggregate(w1, [(_w(2.0, -1.0), 5)])
    assert np.allclose(w2["a"], 2.5) and np.allclose(w2["b"], -2.0)
    assert np.allclose(strategy.m["a"], 1.5) and np.allclose(strategy.m["b"], 0.0)
    assert strategy.rounds == 2 and strategy.m["a"].dtype == np.float64 and w2["a"].dtype == np.float32


def test_the_step_is_the_server_learning_rate_times_the_momentum():
    strategy = FedAvgM(FleetSpec(strategy="fedavgm", server_lr=0.5, momentum=0.9))
    w1 = strategy.aggregate(_w(0.0, 0.0), [(_w(1.0, 3.0), 30), (_w(4.0, -1.0), 10)])  # mean (1.75, 2)
    assert np.allclose(w1["a"], 0.875) and np.allclose(w1["b"], 1.0)
    w2 = strategy.aggregate(w1, [(w1, 7)])  # no new delta: momentum alone moves it, 0.5 * 0.9 * m
    assert np.allclose(w2["a"], 0.875 + 0.5 * 0.9 * 1.75) and np.allclose(w2["b"], 1.0 + 0.5 * 0.9 * 2.0)


def test_each_run_starts_without_momentum():
    spec = FleetSpec(strategy="fedavgm", momentum=0.5)
    first = FedAvgM(spec)
    first.aggregate(_w(0.0, 0.0), [(_w(1.0, 1.0), 1)])
    assert FedAvgM(spec).m == {} and first.m


@pytest.mark.parametrize("case", recorded.cases("fedavgm"))
def test_the_same_numbers_as_the_old_function_recorded(case):
    replay_recorded(FedAvgM, case)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("server_lr", "momentum"), [(1.0, 0.9), (0.5, 0.7)])
def test_the_same_numbers_as_the_frozen_old_function(seed, server_lr, momentum):
    replay_frozen(FedAvgM, FleetSpec(strategy="fedavgm", server_lr=server_lr, momentum=momentum), seed)
