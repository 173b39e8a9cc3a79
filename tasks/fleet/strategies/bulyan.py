"""Bulyan (El Mhamdi et al., "The Hidden Vulnerability of Distributed Learning in Byzantium", ICML
2018). With ``f = fleet.byzantine`` among ``n >= 4f + 3`` boards: Krum picks ``theta = n - 2f``
updates one at a time, each time from those not yet picked (the neighbours counted as Krum does,
at least one); then each coordinate is the mean of the ``beta = theta - 2f`` picked values closest
to their coordinate-wise median (ties: the earlier pick). The boards never picked are excluded."""

from __future__ import annotations

import numpy as np

from tasks.fleet.strategies.base import Update
from tasks.fleet.strategies.krum import krum_scores, squared_distances
from tasks.fleet.strategies.robust import RobustStrategy, byzantine_rule, flat, names_of, per_tensor
from tasks.fleet.weights import Weights
from tasks.recipe.extras import FleetSpec


def bulyan_picks(d2: np.ndarray, f: int) -> list[int]:
    """The ``n - 2f`` rows Krum picks one by one from the rows left, in the order picked."""
    left, picked = list(range(len(d2))), []
    for _ in range(len(d2) - 2 * f):
        scores = krum_scores(d2[np.ix_(left, left)], f)
        picked.append(left.pop(int(np.argmin(scores))))
    return picked


def closest_to_median(stack: np.ndarray, beta: int) -> np.ndarray:
    """Per coordinate, the mean of the ``beta`` values of ``stack`` (axis 0) closest to their median."""
    gap = np.abs(stack - np.median(stack, axis=0))
    order = np.argsort(gap, axis=0, kind="stable")[:beta]
    return np.take_along_axis(stack, order, axis=0).mean(axis=0)


class Bulyan(RobustStrategy):
    """Krum's picks, then a trimmed mean around their median, coordinate by coordinate."""

    @classmethod
    def requirement(cls, spec: FleetSpec, n: int) -> tuple[str, str, object] | None:
        """At least ``4 * byzantine + 3`` boards."""
        return byzantine_rule(spec, n, 4)

    def combine(self, global_w: Weights, updates: list[Update]) -> Weights:
        """Bulyan's center; :attr:`excluded` names the boards Krum never picked."""
        n, f = len(updates), self.spec.byzantine
        self.check_round(n)
        picked = bulyan_picks(squared_distances(flat(updates, names_of(updates))), f)
        self.excluded = tuple(i for i in range(n) if i not in picked)
        beta = len(picked) - 2 * f
        return per_tensor([updates[i] for i in picked], lambda s: closest_to_median(s, beta))
