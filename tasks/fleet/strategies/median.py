"""Coordinate-wise median (Yin et al., "Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates", 2018): each weight of the center is the median of that weight over the boards
(the mean of the two middle values for an even count), so fewer than half the boards, however bad,
cannot move it past the good boards' range."""

from __future__ import annotations

import numpy as np

from tasks.fleet.strategies.base import Update
from tasks.fleet.strategies.robust import RobustStrategy, per_tensor
from tasks.fleet.weights import Weights


class Median(RobustStrategy):
    """``center[k] = median_i(w_i[k])`` for every coordinate ``k``; no board weighs more than another."""

    def combine(self, global_w: Weights, updates: list[Update]) -> Weights:
        """The coordinate-wise median of the boards' tensors."""
        self.excluded = ()
        return per_tensor(updates, lambda s: np.median(s, axis=0))
