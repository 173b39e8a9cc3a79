"""What every aggregation strategy is: built from the recipe's ``[fleet]`` spec, it turns one round's
board updates into the next global weights and keeps its own server state from round to round.

Every strategy here starts from the sample-weighted mean of the boards' tensors (McMahan et al.,
2017) and treats ``delta = mean - global`` as a pseudo-gradient (Reddi et al., "Adaptive Federated
Optimization", 2021, Algorithm 2): :meth:`Strategy.aggregate` computes both and moves each tensor by
``server_lr * step``, where ``step`` is what the subclass's :meth:`Strategy.step` makes of ``delta``.
A strategy that does not start from the mean (a trimmed mean, a median, Krum) overrides
:meth:`Strategy.combine`, which makes the boards' tensors one; :meth:`Strategy.apply` takes the
step from there (the fleet's central differential privacy noises the combined tensors in between).

The arithmetic runs in float64 and each tensor goes back to its own dtype, as the single
``aggregate()`` function these classes replaced did, bit for bit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from tasks.errors import FleetError
from tasks.fleet.weights import Weights
from tasks.recipe.extras import FleetSpec

Update = tuple[Weights, int]  # one board's trained tensors and the samples it trained on


def weighted_mean(updates: list[Update]) -> Weights:
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


def streamed_mean(load: Callable[[int], Weights], count: int, samples: list[int]) -> Weights:
    """:func:`weighted_mean` over ``count`` updates read one at a time (``load(i)``, its ``samples[i]``):
    the same float64 additions in the same order, so the same tensors to the bit, holding one update
    and the running sum (a thousand boards' round does not hold a thousand updates)."""
    if count == 0:
        raise FleetError("no board update to aggregate")
    total = sum(samples)
    if total <= 0:
        raise FleetError("the boards' updates hold no training samples")
    acc: dict[str, np.ndarray] = {}
    dtypes: dict[str, np.dtype] = {}
    names: list[str] = []
    for i in range(count):
        w = load(i)
        if i == 0:
            names = sorted(w)
            acc = {n: np.zeros(w[n].shape, np.float64) for n in names}
            dtypes = {n: w[n].dtype for n in names}
        elif sorted(w) != names:
            raise FleetError(f"the boards returned different tensors ({sorted(w)} vs {names})")
        for name in names:
            acc[name] += (samples[i] / total) * w[name].astype(np.float64)
    return {n: acc[n].astype(dtypes[n]) for n in names}


class Strategy(ABC):
    """A server-side aggregation strategy: ``new = strategy.aggregate(global_w, updates)`` once per
    round, the same instance for every round of a run (it holds the server state)."""

    def __init__(self, spec: FleetSpec) -> None:
        """A strategy with ``spec``'s hyperparameters (``server_lr`` and whichever of ``momentum``,
        ``beta2``, ``tau`` it uses) and no server state yet."""
        self.spec = spec
        self.rounds = 0  # rounds aggregated so far
        self.excluded: tuple[int, ...] = ()  # indices of the last round's updates combine() left out

    def aggregate(self, global_w: Weights, updates: list[Update]) -> Weights:
        """The next global weights from the current ones and this round's ``updates`` (each board's
        tensors and sample count); FleetError when the updates do not match the global model."""
        return self.apply(global_w, self.combine(global_w, updates))

    @property
    def streams(self) -> bool:
        """Whether :meth:`combine` is the sample-weighted mean, which a round can take update by
        update (:func:`streamed_mean`) instead of holding every update: the robust strategies need
        them all at once (a median, Krum's distances), a buffer as large as the round's updates."""
        return type(self).combine is Strategy.combine

    def combine(self, global_w: Weights, updates: list[Update]) -> Weights:
        """The boards' tensors made one: the sample-weighted mean here; a robust strategy overrides it
        (a median, a trimmed mean, the updates Krum selects) and names what it left out in
        :attr:`excluded`."""
        self.excluded = ()
        return weighted_mean(updates)

    def apply(self, global_w: Weights, center: Weights) -> Weights:
        """Move ``global_w`` by ``server_lr * step(center - global_w)``, tensor by tensor (float64, each
        tensor back to its dtype); ``center`` is :meth:`combine`'s answer or a private mean of it."""
        missing = sorted(set(global_w) ^ set(center))
        if missing:
            raise FleetError(
                f"the boards' tensors do not match the global model's (first difference: {missing[0]})"
            )
        self.rounds += 1
        new: Weights = {}
        for name, w in global_w.items():
            w64 = w.astype(np.float64)
            delta = center[name].astype(np.float64) - w64
            new[name] = (w64 + self.spec.server_lr * self.step(name, delta)).astype(w.dtype)
        return new

    @abstractmethod
    def step(self, name: str, delta: np.ndarray) -> np.ndarray:
        """The server's step for tensor ``name`` (scaled by ``server_lr`` by the caller) from its
        pseudo-gradient ``delta = mean - global`` (float64); updates the strategy's state."""
