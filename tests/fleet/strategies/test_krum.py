"""Multi-Krum (tasks.fleet.strategies.krum) against Blanchard et al. (2017)'s definition written
here on its own, and the group-size rule at recipe load and at the round."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tasks.errors import FleetError, RecipeError
from tasks.fleet.strategies import Krum, check_group
from tasks.recipe.extras import FleetSpec
from tests.fleet.strategies.fleets import fleets, vector


def reference_krum(updates: list, f: int, m: int) -> tuple[list[float], list[int]]:
    """Blanchard et al.: score(i) = sum of ||V_i - V_j||^2 over the n - f - 2 closest j != i; the m
    lowest scores (ties: the earlier board) are averaged. Returns (the average, the chosen boards)."""
    vs = [vector(w) for w, _ in updates]
    n = len(vs)
    dist = [
        [math.fsum((a - b) ** 2 for a, b in zip(vs[i], vs[j], strict=True)) for j in range(n)]
        for i in range(n)
    ]
    scores = [math.fsum(sorted(dist[i][j] for j in range(n) if j != i)[: n - f - 2]) for i in range(n)]
    chosen = sorted(sorted(range(n), key=lambda i: (scores[i], i))[:m])
    mean = [math.fsum(vs[i][k] for i in chosen) / m for k in range(len(vs[0]))]
    return mean, chosen


@settings(max_examples=120, deadline=None)
@given(fleets(min_boards=3), st.integers(0, 99), st.integers(0, 99))
@example([({"t0": np.array([v])}, 1) for v in (0.0, 1.0, 3.0, 4.0)], 0, 0)  # boards 1, 2 tie: 1 kept
def test_the_selected_boards_and_their_mean_are_the_papers(updates, f_draw, m_draw):
    n = len(updates)
    f = f_draw % ((n - 3) // 2 + 1)  # 0 .. the most Krum allows
    m = 1 + m_draw % (n - f)  # 1 .. n - f
    strategy = Krum(FleetSpec(strategy="krum", byzantine=f, krum_select=m))
    got = strategy.combine({}, updates)
    want, chosen = reference_krum(updates, f, m)
    assert strategy.excluded == tuple(i for i in range(n) if i not in chosen)
    assert np.allclose([v for name in sorted(got) for v in got[name].ravel()], want, rtol=1e-12, atol=1e-9)


def test_krum_select_zero_keeps_all_but_the_byzantine_count():
    ups = [({"a": np.array([v])}, 1) for v in (0.0, 0.1, 0.2, 0.3, 0.4, 80.0, -90.0)]
    strategy = Krum(FleetSpec(strategy="krum", byzantine=2))
    got = strategy.combine({}, ups)
    assert strategy.excluded == (5, 6) and np.isclose(got["a"][0], 0.2)


def test_a_group_too_small_is_refused_at_load_naming_the_field():
    with pytest.raises(
        RecipeError, match=r"fleet.byzantine.*at most 2 .*krum needs n >= 2 \* byzantine \+ 3.* 8 boards"
    ):
        check_group(FleetSpec(strategy="krum", byzantine=3), 8)
    with pytest.raises(RecipeError, match=r"fleet.krum_select.*at most n - byzantine = 7"):
        check_group(FleetSpec(strategy="krum", byzantine=1, krum_select=8), 8)
    check_group(FleetSpec(strategy="krum", byzantine=2), 7)  # 7 > 2 * 2 + 2


def test_a_round_with_too_few_updates_fails_in_one_line():
    ups = [({"a": np.array([float(v)])}, 1) for v in range(4)]
    with pytest.raises(
        FleetError, match=r"^krum cannot combine 4 updates with fleet.byzantine = 1: expected"
    ):
        Krum(FleetSpec(strategy="krum", byzantine=1)).combine({}, ups)
