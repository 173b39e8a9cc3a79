"""Bulyan (tasks.fleet.strategies.bulyan) against El Mhamdi et al. (2018)'s definition written here
on its own: Krum picks theta = n - 2f updates one by one from those left, then each coordinate
averages the beta = theta - 2f picked values closest to the picked values' median."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.errors import RecipeError
from tasks.fleet.strategies import Bulyan, check_group
from tasks.recipe.extras import FleetSpec
from tests.fleet.strategies.fleets import fleets, vector
from tests.fleet.strategies.test_median import reference_median


def reference_bulyan(updates: list, f: int) -> tuple[list[float], list[int]]:
    """The paper's two steps, Krum's neighbour count at least one and at most those left."""
    vs = [vector(w) for w, _ in updates]
    left, picked = list(range(len(vs))), []

    def d2(i: int, j: int) -> float:
        return math.fsum((a - b) ** 2 for a, b in zip(vs[i], vs[j], strict=True))

    while len(picked) < len(vs) - 2 * f:
        k = min(max(1, len(left) - f - 2), len(left) - 1)
        score = {i: math.fsum(sorted(d2(i, j) for j in left if j != i)[:k]) for i in left}
        best = min(left, key=lambda i: (score[i], left.index(i)))
        picked.append(best)
        left.remove(best)
    beta = len(picked) - 2 * f
    out = []
    for c in range(len(vs[0])):
        values = [vs[i][c] for i in picked]
        med = reference_median(values)
        near = sorted(range(len(values)), key=lambda j: (abs(values[j] - med), j))[:beta]
        out.append(math.fsum(values[j] for j in near) / beta)
    return out, sorted(picked)


@settings(max_examples=80, deadline=None)
@given(fleets(min_boards=3, max_boards=11), st.data())
def test_the_picks_and_the_center_are_the_papers(updates, data):
    n = len(updates)
    f = data.draw(st.integers(0, (n - 3) // 4))
    strategy = Bulyan(FleetSpec(strategy="bulyan", byzantine=f))
    got = strategy.combine({}, updates)
    want, picked = reference_bulyan(updates, f)
    assert strategy.excluded == tuple(i for i in range(n) if i not in picked)
    assert np.allclose([v for name in sorted(got) for v in got[name].ravel()], want, rtol=1e-12, atol=1e-9)


def test_it_needs_four_f_plus_three_boards():
    with pytest.raises(
        RecipeError, match=r"fleet.byzantine.*at most 1 .*bulyan needs n >= 4 \* byzantine \+ 3"
    ):
        check_group(FleetSpec(strategy="bulyan", byzantine=2), 8)
    check_group(FleetSpec(strategy="bulyan", byzantine=1), 7)
