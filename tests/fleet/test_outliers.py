"""Per-board update figures (tasks.fleet.outliers): norms, cosines to the aggregate's and the median
update, and the outlier rule, against a plain restatement of the rule on generated rounds."""

from __future__ import annotations

import math
import statistics

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tasks.fleet.outliers import norm_outliers, update_figures


def _reference_far(norms: list[float]) -> list[bool]:
    """The rule as the report states it: more than 3 x 1.4826 x MAD above the median, 3+ boards."""
    if len(norms) < 3:
        return [False] * len(norms)
    med = statistics.median(norms)
    mad = statistics.median(abs(n - med) for n in norms)
    return [n > med + 3 * 1.4826 * mad for n in norms]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), max_size=12))
@example([1.0, 1.0, 1.0, 1.0001])  # no spread among the others: any excess stands out
@example([1.0, 2.0])  # two boards: nothing to judge by
def test_the_norm_rule_is_the_stated_one(norms):
    assert norm_outliers(norms) == _reference_far(norms)


def _w(*values: float) -> dict[str, np.ndarray]:
    return {"a": np.array(values[:2], np.float32), "b": np.array([values[2:]], np.float64)}


def test_a_scaled_sign_flipped_update_is_flagged_for_its_norm_and_direction():
    g = _w(0, 0, 0, 0)
    honest = [_w(1, 1, 1, 1.2), _w(1.1, 0.9, 1, 1), _w(0.9, 1.1, 1.1, 1), _w(1, 1, 0.9, 0.8)]
    bad = _w(-10, -10, -10, -10)
    agg = _w(1, 1, 1, 1)
    figs = update_figures(g, [*honest, bad], agg, excluded=(2,))
    assert [f["outlier"] for f in figs] == [False, False, True, False, True]
    assert figs[4]["kinds"] == ["norm", "direction"] and figs[2]["kinds"] == ["left out"]
    assert math.isclose(figs[4]["norm"], 20.0) and math.isclose(figs[4]["cos_aggregate"], -1.0)
    assert figs[0]["cos_median"] > 0.9 and len(figs[4]["why"]) == 2


def test_a_board_that_did_not_move_has_no_direction():
    g = _w(1, 1, 1, 1)
    figs = update_figures(g, [g, _w(2, 2, 2, 2)], _w(1.5, 1.5, 1.5, 1.5))
    assert figs[0]["norm"] == 0 and figs[0]["cos_aggregate"] is None and not figs[0]["outlier"]
