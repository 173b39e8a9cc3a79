"""The interface (tasks.fleet.strategies.base): the sample-weighted mean and its refusals, updates
that do not match the global model, and what a new strategy has to write (one ``step``)."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import FleetError
from tasks.fleet.strategies import Strategy, weighted_mean
from tasks.recipe.extras import FleetSpec


def _w(v: float) -> dict[str, np.ndarray]:
    return {"a": np.full((2,), v, np.float32), "b": np.array([[v]], np.float32)}


class Halfway(Strategy):
    """A strategy as a new one would be written: half the pseudo-gradient, no state."""

    def step(self, name: str, delta: np.ndarray) -> np.ndarray:
        return delta / 2


def test_the_weighted_mean_weighs_by_samples_and_keeps_dtypes():
    got = weighted_mean([(_w(1.0), 30), (_w(4.0), 10)])
    assert np.allclose(got["a"], 1.75) and np.allclose(got["b"], 1.75) and got["a"].dtype == np.float32


def test_mismatched_or_empty_updates_are_refused():
    with pytest.raises(FleetError, match="different tensors"):
        weighted_mean([(_w(1.0), 1), ({"a": np.zeros(2, np.float32)}, 1)])
    with pytest.raises(FleetError, match="no training samples"):
        weighted_mean([(_w(1.0), 0)])
    with pytest.raises(FleetError, match="no board update"):
        weighted_mean([])


def test_updates_that_do_not_match_the_global_model_are_refused():
    strategy = Halfway(FleetSpec())
    with pytest.raises(FleetError, match="do not match the global model's"):
        strategy.aggregate({"a": np.zeros(2, np.float32)}, [(_w(1.0), 1)])
    assert strategy.rounds == 0


def test_the_interface_is_abstract():
    with pytest.raises(TypeError):
        Strategy(FleetSpec())  # type: ignore[abstract]


def test_a_new_strategy_is_one_step_method():
    strategy = Halfway(FleetSpec(server_lr=0.5))
    got = strategy.aggregate(_w(0.0), [(_w(8.0), 1)])  # 0.5 * 8 / 2
    assert np.allclose(got["a"], 2.0) and got["b"].dtype == np.float32 and strategy.rounds == 1
