"""Server-side aggregation strategies of a federated round, by the name ``[fleet] strategy`` gives.

    strategy = make_strategy(recipe.fleet)           # once per run: it keeps the server state
    global_w = strategy.aggregate(global_w, updates)  # every round; updates: [(tensors, samples)]

A new strategy is one module here (a :class:`Strategy` subclass) and one line in ``STRATEGIES``; the
recipe schema's ``FLEET_STRATEGIES`` (the recipe layer sits below this one and cannot import it) and
the fleet flow's ``strategy`` parameter list the same names, held equal by
``tests/fleet/strategies/test_registry.py``.

Flower's strategies implement the same updates, but flwr 1.42 declares protobuf < 7 and rich < 15
(this stack pins protobuf 7.36 and rich 15) and brings grpc, cryptography and uv; its aggregation
functions do run beside our pins when installed without its dependencies, which is how the robust
strategies here were cross-checked once (median, trimmed mean, Krum, Bulyan agree to 1e-12); the
tests compare each strategy with the paper's formula written on their own.
"""

from __future__ import annotations

from tasks.errors import RecipeError
from tasks.fleet.strategies.base import Strategy, Update, weighted_mean
from tasks.fleet.strategies.bulyan import Bulyan
from tasks.fleet.strategies.fedadam import FedAdam
from tasks.fleet.strategies.fedavg import FedAvg
from tasks.fleet.strategies.fedavgm import FedAvgM
from tasks.fleet.strategies.krum import Krum
from tasks.fleet.strategies.median import Median
from tasks.fleet.strategies.robust import RobustStrategy
from tasks.fleet.strategies.trimmed_mean import TrimmedMean
from tasks.recipe.extras import FleetSpec

STRATEGIES: dict[str, type[Strategy]] = {
    "fedavg": FedAvg,
    "fedavgm": FedAvgM,
    "fedadam": FedAdam,
    "median": Median,
    "trimmed_mean": TrimmedMean,
    "krum": Krum,
    "bulyan": Bulyan,
}

__all__ = [
    "STRATEGIES",
    "Bulyan",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "Krum",
    "Median",
    "RobustStrategy",
    "Strategy",
    "TrimmedMean",
    "Update",
    "check_group",
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


def check_group(spec: FleetSpec, n: int, over: str = "") -> None:
    """RecipeError naming the field when ``spec``'s strategy cannot run over a group of ``n`` boards
    (Krum needs more than ``2 * byzantine + 2``, Bulyan at least ``4 * byzantine + 3``); ``over``
    says what the ``n`` are when not the group's boards (a buffer of arrivals)."""
    cls = STRATEGIES.get(spec.strategy)
    if cls is not None and issubclass(cls, RobustStrategy):
        cls.check_group(spec, n, over)
