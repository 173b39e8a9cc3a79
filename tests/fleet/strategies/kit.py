"""What the strategy tests share: bit-for-bit comparison of tensors, and running a strategy class
beside today's numerics (the recorded outputs of ``recorded.py``, the frozen old function of
``frozen.py``) round after round."""

from __future__ import annotations

import numpy as np

from tasks.fleet.strategies import Strategy
from tasks.recipe.extras import FleetSpec
from tests.fleet.strategies import recorded
from tests.fleet.strategies.frozen import OldServerState, old_aggregate

Weights = dict[str, np.ndarray]
DTYPES = (np.float16, np.float32, np.float64)


def assert_bitwise(got: Weights, want: Weights, what: str = "") -> None:
    """Same tensor names, and each tensor the same dtype, shape and bytes (``-0.0`` is not ``0.0``)."""
    assert sorted(got) == sorted(want), what
    for name in want:
        g, w = got[name], want[name]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{what} {name}"
        assert g.tobytes() == w.tobytes(), f"{what} {name}: max diff {np.max(np.abs(g - w))}"


def replay_recorded(cls: type[Strategy], case: str) -> None:
    """Run ``cls`` over the recorded rounds of ``case``: every round's global weights and the final
    server state equal, bit for bit, what the old function returned."""
    strategy = cls(recorded.spec(case))
    w = recorded.global_weights()
    for r, (updates, want) in enumerate(zip(recorded.rounds(), recorded.expected_rounds(case), strict=True)):
        w = strategy.aggregate(w, updates)
        assert_bitwise(w, want, f"{case} round {r + 1}")
    m, v = recorded.expected_state(case)
    assert_bitwise(getattr(strategy, "m", {}), m, f"{case} m")
    assert_bitwise(getattr(strategy, "v", {}), v, f"{case} v")
    assert strategy.rounds == len(recorded.rounds())


def random_rounds(seed: int, n_rounds: int = 3) -> tuple[Weights, list[list[tuple[Weights, int]]]]:
    """A random global model (1-3 tensors of random shapes and float dtypes) and ``n_rounds`` rounds
    of 1-4 boards' updates near it, with random sample counts."""
    rng = np.random.default_rng(seed)
    shapes = {f"t{i}": tuple(rng.integers(1, 5, size=rng.integers(0, 3))) for i in range(rng.integers(1, 4))}
    dtypes = {name: DTYPES[rng.integers(len(DTYPES))] for name in shapes}
    g = {k: rng.standard_normal(s).astype(dtypes[k]) for k, s in shapes.items()}
    rounds = [
        [
            ({k: (g[k] + 0.3 * rng.standard_normal(s)).astype(dtypes[k]) for k, s in shapes.items()},
             int(rng.integers(1, 200)))
            for _ in range(rng.integers(1, 5))
        ]
        for _ in range(n_rounds)
    ]  # fmt: skip
    return g, rounds


def replay_frozen(cls: type[Strategy], spec: FleetSpec, seed: int) -> None:
    """Run ``cls`` and the frozen old function side by side over ``random_rounds(seed)``: the same
    global weights every round and the same server state after the last."""
    g, rounds = random_rounds(seed)
    strategy, state = cls(spec), OldServerState()
    got, want = g, g
    for r, updates in enumerate(rounds):
        got = strategy.aggregate(got, updates)
        want = old_aggregate(want, updates, spec, state)
        assert_bitwise(got, want, f"seed {seed} round {r + 1}")
    assert_bitwise(getattr(strategy, "m", {}), state.m, f"seed {seed} m")
    assert_bitwise(getattr(strategy, "v", {}), state.v, f"seed {seed} v")
