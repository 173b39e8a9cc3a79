"""Server-side aggregation strategies of a federated round, by the name ``[fleet] strategy`` gives.

    strategy = make_strategy(recipe.fleet)           # once per run: it keeps the server state
    global_w = strategy.aggregate(global_w, updates)  # every round; updates: [(tensors, samples)]

A new strategy is one module here (a :class:`Strategy` subclass) and one line in ``STRATEGIES``; the
recipe schema's ``FLEET_STRATEGIES`` (the recipe layer sits below this one and cannot import it) and
the fleet flow's ``strategy`` parameter list the same names, held equal by
``tests/fleet/strategies/test_registry.py``.

Flower's strategies implement the same updates, but flwr 1.42 needs a certifi this registry lacks
and the older releases pin cryptography/click/packaging below this stack's constraints (and bring
grpc); the arithmetic is a few numpy lines.
"""

from __future__ import annotations

from tasks.errors import RecipeError
from tasks.fleet.strategies.base import Strategy, Update, weighted_mean
from tasks.fleet.strategies.fedadam import FedAdam
from tasks.fleet.strategies.fedavg import FedAvg
from tasks.fleet.strategies.fedavgm import FedAvgM
from tasks.recipe.extras import FleetSpec

STRATEGIES: dict[str, type[Strategy]] = {
    "fedavg": FedAvg,
    "fedavgm": FedAvgM,
    "fedadam": FedAdam,
}

__all__ = [
    "STRATEGIES",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "Strategy",
    "Update",
    "make_strategy",
    "weighted_mean",
]


def make_strategy(spec: FleetSpec) -> Strategy:
    """A fresh strategy (no server state) for ``spec.strategy``; RecipeError naming ``fleet.strategy``
    and the known names when there is no such strategy."""
    cls = STRATEGIES.get(spec.strategy)
    if cls is None:
        raise RecipeError("fleet.strategy", " or ".join(repr(s) for s in STRATEGIES), spec.strategy)
    return cls(spec)
