"""The tensors a board sends back after a round (``trainable.npz``), checked before they are averaged
(checkpoints are written by :mod:`tasks.checkpoint`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.errors import FleetError

Weights = dict[str, np.ndarray]


def read_update(path: Path, reference: Weights, board: str) -> Weights:
    """A board's ``trainable.npz``, checked against the global model's names, shapes and dtypes and
    for non-finite values (a diverged board must not poison the aggregate)."""
    with np.load(path, allow_pickle=False) as z:
        got = {k: z[k] for k in z.files}
    if sorted(got) != sorted(reference):
        diff = sorted(set(got) ^ set(reference))
        raise FleetError(
            f"board {board}: trainable.npz tensors differ from the global model's (e.g. {diff[0]!r})"
        )
    for name, w in got.items():
        ref = reference[name]
        if w.shape != ref.shape or w.dtype != ref.dtype:
            raise FleetError(
                f"board {board}: tensor {name!r} is {w.dtype}{list(w.shape)}, expected {ref.dtype}{list(ref.shape)}"
            )
        if not np.isfinite(w).all():
            raise FleetError(f"board {board}: tensor {name!r} holds NaN or inf")
    return got


def nbytes(weights: Weights) -> int:
    """The tensors' raw size in bytes."""
    return int(sum(w.nbytes for w in weights.values()))
