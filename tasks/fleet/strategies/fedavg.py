"""FedAvg (McMahan et al., 2017): the global model moves to the sample-weighted mean of the boards'
tensors (``server_lr`` = 1, the default) or ``server_lr`` of the way there."""

from __future__ import annotations

import numpy as np

from tasks.fleet.strategies.base import Strategy


class FedAvg(Strategy):
    """``w += server_lr * (mean - w)``; no server state."""

    def step(self, name: str, delta: np.ndarray) -> np.ndarray:
        """The pseudo-gradient itself."""
        return delta
