"""Server-side aggregation of a federated round: FedAvg, FedAvgM (server momentum) and FedAdam.

Every strategy starts from the sample-weighted mean of the boards' trained tensors (McMahan et
al., 2017). Plain FedAvg takes it (``server_lr`` = 1 moves the global model all the way there);
the adaptive ones treat ``mean - global`` as a pseudo-gradient step (Reddi et al., "Adaptive
Federated Optimization", 2021, Algorithm 2):

    delta = mean - w
    fedavgm:  m = momentum * m + delta;                       w += server_lr * m
    fedadam:  m = b1 * m + (1 - b1) * delta;  v = b2 * v + (1 - b2) * delta**2
              w += server_lr * m / (sqrt(v) + tau)

Flower's strategies implement the same updates, but flwr 1.42 needs a certifi this registry lacks
and the older releases pin cryptography/click/packaging below this stack's constraints (and bring
grpc); the arithmetic is a few numpy lines, tested against hand-computed values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tasks.errors import FleetError
from tasks.recipe.schema import FleetSpec

Weights = dict[str, np.ndarray]


@dataclass
class ServerState:
    """The aggregation's memory across rounds (the adaptive strategies' moments)."""

    m: Weights = field(default_factory=dict)
    v: Weights = field(default_factory=dict)
    rounds: int = 0


def weighted_mean(updates: list[tuple[Weights, int]]) -> Weights:
    """The sample-weighted mean of the boards' tensors (float64 accumulation, original dtype back)."""
    if not updates:
        raise FleetError("no board update to aggregate")
    total = sum(n for _, n in updates)
    if total <= 0:
        raise FleetError("the boards' updates hold no training samples")
    names = sorted(updates[0][0])
    for w, _ in updates[1:]:
        if sorted(w) != names:
            raise FleetError(f"the boards returned different tensors ({sorted(w)} vs {names})")
    out: Weights = {}
    for name in names:
        acc = np.zeros(updates[0][0][name].shape, np.float64)
        for w, n in updates:
            acc += (n / total) * w[name].astype(np.float64)
        out[name] = acc.astype(updates[0][0][name].dtype)
    return out


def aggregate(
    global_w: Weights, updates: list[tuple[Weights, int]], spec: FleetSpec, state: ServerState
) -> Weights:
    """The next global weights from this round's ``updates`` (weights, samples); ``state`` carries
    the adaptive strategies' moments to the next round."""
    mean = weighted_mean(updates)
    missing = sorted(set(global_w) ^ set(mean))
    if missing:
        raise FleetError(
            f"the boards' tensors do not match the global model's (first difference: {missing[0]})"
        )
    state.rounds += 1
    new: Weights = {}
    for name, w in global_w.items():
        w64 = w.astype(np.float64)
        delta = mean[name].astype(np.float64) - w64
        if spec.strategy == "fedavg":
            step = delta
        elif spec.strategy == "fedavgm":
            m = spec.momentum * state.m.get(name, np.zeros_like(w64)) + delta
            state.m[name] = m
            step = m
        else:  # fedadam
            m = spec.momentum * state.m.get(name, np.zeros_like(w64)) + (1 - spec.momentum) * delta
            v = spec.beta2 * state.v.get(name, np.zeros_like(w64)) + (1 - spec.beta2) * delta**2
            state.m[name], state.v[name] = m, v
            step = m / (np.sqrt(v) + spec.tau)
        new[name] = (w64 + spec.server_lr * step).astype(w.dtype)
    return new
