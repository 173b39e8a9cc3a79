"""Generated fleets for the robust strategies' tests: ``n`` boards' updates of the same 1-3 tensors,
each value a multiple of 1/4 in [-64, 64] (sums of squares are exact in float64, so a tie in Krum's
scores is a real tie, broken by board order in the code and the reference alike), and a few boards
far off (x 1000) as a bad board would be."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

Weights = dict[str, np.ndarray]


@st.composite
def fleets(draw: st.DrawFn, min_boards: int = 1, max_boards: int = 9) -> list[tuple[Weights, int]]:
    """A list of (tensors, samples), one per board, with the same names and shapes."""
    n = draw(st.integers(min_boards, max_boards))
    shapes = draw(st.lists(st.lists(st.integers(1, 3), max_size=2).map(tuple), min_size=1, max_size=3))
    out = []
    for _ in range(n):
        far = draw(st.booleans()) and draw(st.integers(0, 4)) == 0
        w = {}
        for i, shape in enumerate(shapes):
            size = int(np.prod(shape))
            q = draw(st.lists(st.integers(-256, 256), min_size=size, max_size=size))
            w[f"t{i}"] = (np.array(q, np.float64) / 4 * (1000 if far else 1)).reshape(shape)
        out.append((w, draw(st.integers(1, 500))))
    return out


def coordinates(updates: list[tuple[Weights, int]]) -> list[tuple[str, tuple[int, ...], list[float]]]:
    """Every coordinate of every tensor, with the boards' values there as plain floats."""
    first = updates[0][0]
    return [
        (name, idx, [float(w[name][idx]) for w, _ in updates])
        for name in sorted(first)
        for idx in np.ndindex(first[name].shape)
    ]


def vector(w: Weights) -> list[float]:
    """A board's tensors as one list of floats (names sorted, each tensor in C order)."""
    return [float(v) for name in sorted(w) for v in w[name].ravel()]
