"""Multi-Krum (Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
Descent", NeurIPS 2017). With ``f = fleet.byzantine`` bad boards assumed among ``n > 2f + 2``, each
board's score is the sum of squared distances from its update to its ``n - f - 2`` nearest other
updates; the ``m = fleet.krum_select`` boards of lowest score (ties: the earlier board) are kept and
averaged, unweighted, the others excluded. ``m = 1`` is Krum; ``krum_select = 0`` takes ``m = n - f``."""

from __future__ import annotations

import numpy as np

from tasks.fleet.strategies.base import Update
from tasks.fleet.strategies.robust import RobustStrategy, byzantine_rule, flat, names_of, per_tensor
from tasks.fleet.weights import Weights
from tasks.recipe.extras import FleetSpec


def squared_distances(x: np.ndarray) -> np.ndarray:
    """``d[i, j] = ||x_i - x_j||^2`` for the rows of ``x`` (one row at a time: memory ``n * dim``)."""
    return np.stack([((x - row) ** 2).sum(axis=1) for row in x])


def krum_scores(d2: np.ndarray, f: int) -> np.ndarray:
    """Each row's Krum score: the sum of its ``max(1, n - f - 2)`` smallest distances to the others
    (at most the ``n - 1`` there are)."""
    n = len(d2)
    k = min(max(1, n - f - 2), n - 1)
    return np.array([np.sort(np.delete(d2[i], i))[:k].sum() for i in range(n)])


def krum_select(d2: np.ndarray, f: int, m: int) -> list[int]:
    """The ``m`` rows of lowest Krum score, in row order (a stable sort breaks ties by row)."""
    return sorted(int(i) for i in np.argsort(krum_scores(d2, f), kind="stable")[:m])


class Krum(RobustStrategy):
    """The unweighted mean of the ``m`` updates closest to their neighbours; the rest excluded."""

    @classmethod
    def requirement(cls, spec: FleetSpec, n: int) -> tuple[str, str, object] | None:
        """At least ``2 * byzantine + 3`` boards (more than ``2f + 2``); ``krum_select`` at most
        ``n - byzantine``."""
        f = spec.byzantine
        broken = byzantine_rule(spec, n, 2)
        if broken is None and spec.krum_select > n - f:
            return (
                "fleet.krum_select",
                f"at most n - byzantine = {n - f} (0: n - byzantine)",
                spec.krum_select,
            )
        return broken

    def combine(self, global_w: Weights, updates: list[Update]) -> Weights:
        """The mean of the selected updates; :attr:`excluded` names the others."""
        n = len(updates)
        self.check_round(n)
        m = self.spec.krum_select or n - self.spec.byzantine
        chosen = krum_select(squared_distances(flat(updates, names_of(updates))), self.spec.byzantine, m)
        self.excluded = tuple(i for i in range(n) if i not in chosen)
        return per_tensor([updates[i] for i in chosen], lambda s: s.mean(axis=0))
