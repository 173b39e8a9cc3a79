"""FedAdam (Reddi et al., "Adaptive Federated Optimization", 2021, Algorithm 2): an Adam step on the
server from the pseudo-gradient, with ``fleet.momentum`` as beta1, ``fleet.beta2`` and ``fleet.tau``
(the adaptivity, Adam's epsilon). As in the paper, no bias correction."""

from __future__ import annotations

import numpy as np

from tasks.fleet.strategies.base import Strategy
from tasks.fleet.weights import Weights
from tasks.recipe.extras import FleetSpec


class FedAdam(Strategy):
    """``m = b1 * m + (1 - b1) * delta; v = b2 * v + (1 - b2) * delta**2;
    w += server_lr * m / (sqrt(v) + tau)``, ``m`` and ``v`` kept per tensor across rounds."""

    def __init__(self, spec: FleetSpec) -> None:
        """No moments yet (zero for every tensor)."""
        super().__init__(spec)
        self.m: Weights = {}  # tensor name -> first moment (float64)
        self.v: Weights = {}  # tensor name -> second moment (float64)

    def step(self, name: str, delta: np.ndarray) -> np.ndarray:
        """The adaptive step after updating both moments with this round's ``delta``."""
        b1, b2 = self.spec.momentum, self.spec.beta2
        m = b1 * self.m.get(name, np.zeros_like(delta)) + (1 - b1) * delta
        v = b2 * self.v.get(name, np.zeros_like(delta)) + (1 - b2) * delta**2
        self.m[name], self.v[name] = m, v
        return m / (np.sqrt(v) + self.spec.tau)
