"""A frozen copy of the single ``aggregate()`` function (``tasks/fleet/aggregate.py`` at commit
9b9f3f9) that the strategy classes replaced, kept only as the reference the classes must match bit
for bit on random inputs (``recorded.py`` holds what the original itself returned). Do not edit."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tasks.recipe.extras import FleetSpec

Weights = dict[str, np.ndarray]


@dataclass
class OldServerState:
    """The old function's memory across rounds."""

    m: Weights = field(default_factory=dict)
    v: Weights = field(default_factory=dict)
    rounds: int = 0


def old_weighted_mean(updates: list[tuple[Weights, int]]) -> Weights:
    """The old sample-weighted mean (its error checks left out: ``test_base.py`` covers them)."""
    total = sum(n for _, n in updates)
    names = sorted(updates[0][0])
    out: Weights = {}
    for name in names:
        acc = np.zeros(updates[0][0][name].shape, np.float64)
        for w, n in updates:
            acc += (n / total) * w[name].astype(np.float64)
        out[name] = acc.astype(updates[0][0][name].dtype)
    return out


def old_aggregate(
    global_w: Weights, updates: list[tuple[Weights, int]], spec: FleetSpec, state: OldServerState
) -> Weights:
    """The old next global weights, branch by branch on ``spec.strategy``."""
    mean = old_weighted_mean(updates)
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
