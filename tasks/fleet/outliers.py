"""Which boards' updates look wrong, per round: each board's update norm and its cosine to the
aggregate's update, and an outlier flag with its reasons, recorded in the round and shown in the
fleet report.

A board's update is ``its tensors - the round's global tensors``, all trained tensors as one vector.
It is flagged an **outlier** when any of these holds (:data:`RULE`):

* its norm is more than 3 scaled median absolute deviations above the round's median norm
  (``norm > median + 3 * 1.4826 * MAD``, a robust z-score over 3; rounds of 3 boards or more);
* it points away from what most boards did: its cosine to the coordinate-wise median of the
  round's updates is below 0 (the median, not the aggregate: a FedAvg aggregate that a scaled bad
  update dragged along would make every honest board look wrong);
* the robust strategy left it out of the aggregate (Krum, Bulyan).

Past :data:`SAMPLE` boards the median is taken over that many updates spread over the round
(:func:`streamed_figures`), so the figures of a thousand boards' round hold a bounded number of
updates in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tasks.fleet.weights import Weights

MAD_SCALE = 1.4826  # MAD of a normal sample times this estimates its standard deviation
Z_MAX = 3.0
RULE = (
    f"norm > median + {Z_MAX:g} x {MAD_SCALE} x MAD of the round's norms (3+ boards), or cosine < 0 "
    "to the median update, or left out by the strategy"
)


def _flat(weights: Weights, base: Weights) -> np.ndarray:
    return np.concatenate(
        [(weights[n].astype(np.float64) - base[n].astype(np.float64)).ravel() for n in sorted(base)]
    )


def cosine(a: np.ndarray, b: np.ndarray) -> float | None:
    """The cosine of two vectors; None when either is zero (no direction)."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return None if na == 0 or nb == 0 else float(np.dot(a, b) / (na * nb))


def norm_outliers(norms: list[float]) -> list[bool]:
    """For each norm, whether it is more than ``Z_MAX`` scaled MADs above the median (never with
    fewer than 3 norms: there is no spread to judge by)."""
    if len(norms) < 3:
        return [False] * len(norms)
    med = float(np.median(norms))
    mad = MAD_SCALE * float(np.median(np.abs(np.asarray(norms) - med)))
    return [n > med + Z_MAX * mad for n in norms]


SAMPLE = 64  # updates the median reference is taken over, at most (all of them up to this many boards)


def update_figures(
    global_w: Weights, updates: list[Weights], aggregate: Weights, excluded: tuple[int, ...] = ()
) -> list[dict[str, Any]]:
    """Per update (in order): ``norm``, ``cos_aggregate`` (to the aggregate's update),
    ``cos_median`` (to the coordinate-wise median update), ``outlier``, its ``kinds`` (norm,
    direction, left out) and the ``why`` of each, one sentence."""
    return streamed_figures(global_w, updates.__getitem__, len(updates), aggregate, excluded)


def streamed_figures(
    global_w: Weights, load: Callable[[int], Weights], count: int, aggregate: Weights,
    excluded: tuple[int, ...] = (), sample: int = SAMPLE,
) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`update_figures` over ``count`` updates read one at a time (``load(i)``, twice each), so
    that a thousand boards' round holds two updates and ``sample`` deltas, not every update: the
    median reference is the coordinate-wise median of ``sample`` updates spread evenly over the round
    (every update up to ``sample`` boards: then the figures are exactly those of all of them)."""
    picks = (
        set(np.linspace(0, count - 1, min(count, sample)).round().astype(int).tolist()) if count else set()
    )
    norms, held = [], []
    for i in range(count):
        d = _flat(load(i), global_w)
        norms.append(float(np.linalg.norm(d)))
        if i in picks:
            held.append(d)
    median = np.median(np.stack(held), axis=0) if held else None
    to_aggregate = _flat(aggregate, global_w)
    far = norm_outliers(norms)
    out = []
    for i in range(count):
        d = _flat(load(i), global_w)
        cos_agg, cos_med = cosine(d, to_aggregate), cosine(d, median)
        why = {}
        if far[i]:
            why["norm"] = (
                f"norm {norms[i]:.3g} > {Z_MAX:g} MADs above the median {float(np.median(norms)):.3g}"
            )
        if cos_med is not None and cos_med < 0:
            why["direction"] = f"against the median update (cosine {cos_med:.2f})"
        if i in excluded:
            why["left out"] = "left out by the strategy"
        out.append({"norm": norms[i], "cos_aggregate": cos_agg, "cos_median": cos_med, "outlier": bool(why),
                    "kinds": list(why), "why": list(why.values())})  # fmt: skip
    return out
