"""FedAvgM (Hsu et al., 2019): FedAvg with server momentum, ``fleet.momentum`` (default 0.9)."""

from __future__ import annotations

import numpy as np

from tasks.fleet.strategies.base import Strategy
from tasks.fleet.weights import Weights
from tasks.recipe.extras import FleetSpec


class FedAvgM(Strategy):
    """``m = momentum * m + delta; w += server_lr * m``, ``m`` kept per tensor across rounds."""

    def __init__(self, spec: FleetSpec) -> None:
        """No momentum yet (zero for every tensor)."""
        super().__init__(spec)
        self.m: Weights = {}  # tensor name -> momentum (float64)

    def step(self, name: str, delta: np.ndarray) -> np.ndarray:
        """The momentum after adding this round's ``delta``."""
        m = self.spec.momentum * self.m.get(name, np.zeros_like(delta)) + delta
        self.m[name] = m
        return m
