"""Coordinate-wise trimmed mean (tasks.fleet.strategies.trimmed_mean) against Yin et al. (2018)'s
definition written here on its own: for each weight, drop the k = floor(beta * n) smallest and k
largest of the n boards' values and average the rest."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tasks.errors import RecipeError
from tasks.fleet.strategies import TrimmedMean
from tasks.recipe.extras import FleetSpec
from tests.fleet.strategies.fleets import coordinates, fleets


def reference_trimmed(values: list[float], beta: float) -> float:
    """Yin et al.'s trimmed mean: beta of the values cut at each end (k = the largest integer with
    k <= beta * n, beta read as the decimal it prints as), the rest averaged."""
    n = len(values)
    k = max(j for j in range(n) if j <= Decimal(repr(beta)) * n)
    kept = sorted(values)[k : n - k]
    return math.fsum(kept) / len(kept)


@settings(max_examples=150, deadline=None)
@given(fleets(), st.floats(0, 0.49))
@example([({"t0": np.array([float(i * i)])}, 1) for i in range(10)], 0.3)  # 3 cut, though 0.3 < 3/10
@example([({"t0": np.array([float(i * i)])}, 1) for i in range(100)], 0.29)  # 29 cut: 0.29 * 100 = 28.999...
@example([({"t0": np.array([v])}, 1) for v in (0.0, 1.0, 2.0, 3.0, 100.0)], 0.2)
def test_each_weight_is_the_mean_without_the_extremes(updates, beta):
    got = TrimmedMean(FleetSpec(strategy="trimmed_mean", trim_fraction=beta)).combine({}, updates)
    for name, idx, values in coordinates(updates):
        want = reference_trimmed(values, beta)
        assert np.isclose(got[name][idx], want, rtol=1e-12, atol=1e-12), (name, idx, values, beta)


def test_without_trimming_it_is_the_unweighted_mean():
    ups = [({"a": np.array([1.0])}, 1), ({"a": np.array([5.0])}, 99)]
    got = TrimmedMean(FleetSpec(strategy="trimmed_mean", trim_fraction=0.0)).combine({}, ups)
    assert got["a"][0] == 3.0


def test_half_or_more_is_refused_naming_the_field():
    try:
        FleetSpec(strategy="trimmed_mean", trim_fraction=0.5)
    except RecipeError as err:
        assert err.field == "fleet.trim_fraction" and "[0, 0.5)" in str(err)
    else:
        raise AssertionError("trim_fraction = 0.5 was accepted")
