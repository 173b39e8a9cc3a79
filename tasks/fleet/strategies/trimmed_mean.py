"""Coordinate-wise trimmed mean (Yin et al., "Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates", 2018): for each weight, the ``k = floor(trim_fraction * n)`` largest and ``k``
smallest values over the ``n`` boards are dropped and the rest averaged (``trim_fraction`` < 0.5
always leaves at least one value)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from tasks.fleet.strategies.base import Update
from tasks.fleet.strategies.robust import RobustStrategy, per_tensor
from tasks.fleet.weights import Weights


def trimmed(n: int, fraction: float) -> int:
    """Values dropped on each side: ``floor(fraction * n)`` for the fraction as the recipe writes it
    (its shortest decimal: 0.3 of 10 boards is 3, though the float 0.3 is a hair below 3/10)."""
    return math.floor(Fraction(repr(fraction)) * n)


class TrimmedMean(RobustStrategy):
    """``center[k] = mean of w_i[k] without its k smallest and k largest``; unweighted."""

    def combine(self, global_w: Weights, updates: list[Update]) -> Weights:
        """The coordinate-wise trimmed mean of the boards' tensors."""
        self.excluded = ()
        n = len(updates)
        k = trimmed(n, self.spec.trim_fraction)
        return per_tensor(updates, lambda s: np.sort(s, axis=0)[k : n - k].mean(axis=0))
