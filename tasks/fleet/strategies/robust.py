"""What the robust strategies share (median, trimmed mean, Krum, Bulyan): the boards' tensors
stacked per name, flattened per board, and the rule a strategy states about how many boards it needs.

A robust strategy does not weigh boards by the samples they report (a bad board could claim any
count): every update counts once, as in the papers. Its :meth:`~Strategy.combine` gives the robust
center of the boards' tensors; the server step from there is FedAvg's (``server_lr`` of the way).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tasks.errors import FleetError, RecipeError
from tasks.fleet.strategies.base import Strategy, Update
from tasks.fleet.weights import Weights
from tasks.recipe.extras import FleetSpec


def names_of(updates: list[Update]) -> list[str]:
    """The tensor names every update holds (FleetError when there is none or they differ)."""
    if not updates:
        raise FleetError("no board update to aggregate")
    names = sorted(updates[0][0])
    for w, _ in updates[1:]:
        if sorted(w) != names:
            raise FleetError(f"the boards returned different tensors ({sorted(w)} vs {names})")
    return names


def stacked(updates: list[Update], name: str) -> np.ndarray:
    """Tensor ``name`` of every update, stacked on a new first axis (float64)."""
    return np.stack([w[name].astype(np.float64) for w, _ in updates])


def flat(updates: list[Update], names: list[str]) -> np.ndarray:
    """One row per update: its tensors flattened and joined in ``names`` order (float64)."""
    return np.stack([np.concatenate([w[n].astype(np.float64).ravel() for n in names]) for w, _ in updates])


def per_tensor(updates: list[Update], combine_one: Callable[[np.ndarray], np.ndarray]) -> Weights:
    """``combine_one(stack)`` (an array of shape ``(n, *shape)`` to one of ``shape``) for every
    tensor, each back to its dtype."""
    return {n: combine_one(stacked(updates, n)).astype(updates[0][0][n].dtype) for n in names_of(updates)}


def byzantine_rule(spec: FleetSpec, n: int, k: int) -> tuple[str, str, object] | None:
    """The rule of Krum (``k = 2``) and Bulyan (``k = 4``): ``n >= k * byzantine + 3`` boards, as
    (field, what was expected, value) when ``n`` breaks it, else None."""
    if n < 3:
        return "fleet.strategy", f"at least 3 boards for {spec.strategy}", spec.strategy
    if n < k * spec.byzantine + 3:
        rule = f"{spec.strategy} needs n >= {k} * byzantine + 3"
        return "fleet.byzantine", f"at most {(n - 3) // k} ({rule})", spec.byzantine
    return None


class RobustStrategy(Strategy):
    """A strategy whose center is robust to some bad boards; its server step is the plain one."""

    @classmethod
    def requirement(cls, spec: FleetSpec, n: int) -> tuple[str, str, object] | None:
        """What ``spec`` asks that ``n`` boards cannot give: (field, what was expected, value), or None."""
        return None

    @classmethod
    def check_group(cls, spec: FleetSpec, n: int, over: str = "") -> None:
        """RecipeError naming the field when a group of ``n`` boards (or what ``over`` says) cannot
        run ``spec``'s strategy."""
        broken = cls.requirement(spec, n)
        if broken is not None:
            over = over or f"the group's {n} boards"
            raise RecipeError(broken[0], f"{broken[1]} over {over}", broken[2])

    def check_round(self, n: int) -> None:
        """FleetError when this round's ``n`` updates are too few for the strategy's settings."""
        broken = self.requirement(self.spec, n)
        if broken is not None:
            raise FleetError(
                f"{self.spec.strategy} cannot combine {n} updates with {broken[0]} = {broken[2]}: "
                f"expected {broken[1]}"
            )

    def step(self, name: str, delta: np.ndarray) -> np.ndarray:
        """The pseudo-gradient itself (FedAvg's step from the robust center)."""
        return delta
