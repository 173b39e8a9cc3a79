"""Coordinate-wise median (tasks.fleet.strategies.median) against Yin et al. (2018)'s definition
written here on its own: for each weight, the middle of the boards' sorted values (the mean of the
two middle ones for an even count), every board counting once whatever its sample count."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings

from tasks.fleet.strategies import Median
from tasks.recipe.extras import FleetSpec
from tests.fleet.strategies.fleets import coordinates, fleets


def reference_median(values: list[float]) -> float:
    """The median of a list, by its definition."""
    s, n = sorted(values), len(values)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@settings(max_examples=150, deadline=None)
@given(fleets())
@example([({"t0": np.array([1.0])}, 1), ({"t0": np.array([3.0])}, 100)])  # even count: mean of the two
def test_each_weight_is_the_median_of_the_boards_values(updates):
    got = Median(FleetSpec(strategy="median")).combine({}, updates)
    for name, idx, values in coordinates(updates):
        assert got[name][idx] == reference_median(values), (name, idx, values)


@settings(max_examples=60, deadline=None)
@given(fleets(min_boards=3))
def test_fewer_than_half_the_boards_cannot_move_it_outside_the_others_range(updates):
    n = len(updates)
    bad = (n - 1) // 2
    poisoned = [({k: v * 0 - 1e9 for k, v in w.items()}, s) for w, s in updates[:bad]] + updates[bad:]
    got = Median(FleetSpec(strategy="median")).combine({}, poisoned)
    for name, idx, values in coordinates(updates[bad:]):
        assert min(values) <= got[name][idx] <= max(values)


def test_the_step_from_the_median_is_server_lr_of_the_way_and_dtypes_are_kept():
    g = {"a": np.zeros(2, np.float32), "b": np.zeros(1, np.float16)}
    ups = [({"a": np.full(2, v, np.float32), "b": np.full(1, v, np.float16)}, 1) for v in (1.0, 2.0, 90.0)]
    strategy = Median(FleetSpec(strategy="median", server_lr=0.5))
    got = strategy.aggregate(g, ups)
    assert np.array_equal(got["a"], [1.0, 1.0]) and got["a"].dtype == np.float32
    assert got["b"].dtype == np.float16 and strategy.excluded == () and strategy.rounds == 1
