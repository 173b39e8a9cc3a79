"""FedAvg (tasks.fleet.strategies.fedavg): the sample-weighted mean of the boards' tensors, tensor by
tensor, ``server_lr`` of the way there, nothing remembered, and today's numerics bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.fleet.strategies import FedAvg
from tasks.recipe.extras import FleetSpec
from tests.fleet.strategies import recorded
from tests.fleet.strategies.kit import replay_frozen, replay_recorded

GRID = np.arange(6, dtype=np.float64).reshape(2, 3)


def _w(conv: float, bias: float, scale: float = 0.0) -> dict[str, np.ndarray]:
    """Three tensors of different shapes and dtypes, each its own value (``conv`` times a grid)."""
    return {
        "conv": (conv * GRID).astype(np.float32),
        "bias": np.array([bias, -bias], np.float32),
        "scale": np.array([scale], np.float64),
    }


def test_the_weighted_mean_tensor_by_tensor():
    updates = [(_w(1.0, 10.0, 2.0), 30), (_w(4.0, -2.0, 1.0), 10), (_w(-2.0, 0.5, -1.0), 60)]
    got = FedAvg(FleetSpec(strategy="fedavg")).aggregate(_w(7.0, 7.0, 7.0), updates)
    # conv: (30 * 1 + 10 * 4 + 60 * -2) / 100 = -0.5; bias: (300 - 20 + 30) / 100 = 3.1;
    # scale: (60 + 10 - 60) / 100 = 0.1 -- whatever the global model was (server_lr = 1)
    assert np.allclose(got["conv"], -0.5 * GRID)
    assert np.allclose(got["bias"], [3.1, -3.1])
    assert np.allclose(got["scale"], [0.1])
    assert {k: v.dtype for k, v in got.items()} == {
        "conv": np.float32,
        "bias": np.float32,
        "scale": np.float64,
    }


def test_a_server_learning_rate_moves_part_of_the_way():
    got = FedAvg(FleetSpec(server_lr=0.5)).aggregate(_w(1.0, 1.0), [(_w(3.0, -1.0), 1)])
    assert np.allclose(got["conv"], 2.0 * GRID) and np.allclose(got["bias"], [0.0, 0.0])


def test_nothing_is_remembered_across_rounds():
    strategy = FedAvg(FleetSpec())
    strategy.aggregate(_w(0.0, 0.0), [(_w(5.0, 5.0), 3)])
    got = strategy.aggregate(_w(0.0, 0.0), [(_w(1.0, 2.0), 1), (_w(3.0, 4.0), 1)])
    assert np.allclose(got["conv"], 2.0 * GRID) and np.allclose(got["bias"], [3.0, -3.0])
    assert strategy.rounds == 2 and not hasattr(strategy, "m")


@pytest.mark.parametrize("case", recorded.cases("fedavg"))
def test_the_same_numbers_as_the_old_function_recorded(case):
    replay_recorded(FedAvg, case)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("server_lr", [1.0, 0.7])
def test_the_same_numbers_as_the_frozen_old_function(seed, server_lr):
    replay_frozen(FedAvg, FleetSpec(strategy="fedavg", server_lr=server_lr), seed)
