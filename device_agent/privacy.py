"""Local differential privacy of a fleet round (``job.json``'s ``privacy``): the board clips its own
update and adds Gaussian noise before anything leaves it, so the host never sees a raw update.

The update is the trained tensors minus the job's starting ones (its checkpoint), all trained
tensors as one vector: it is scaled to L2 norm at most ``clip``, then noise of standard deviation
``noise_multiplier * clip`` is added to every value, drawn from the operating system's entropy
(never from the job's seed, which the host knows). ``trainable.npz`` then holds ``start + that``;
the job exports no inference model and keeps no checkpoint of the raw weights. numpy only: the
host's central mode (:mod:`tasks.fleet.privacy`) uses the same clipping.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from device_agent.privacy_spec import LocalPrivacy

Arrays = dict[str, np.ndarray]


def l2_norm(arrays: Arrays) -> float:
    """The L2 norm of all the arrays as one vector (float64)."""
    return math.sqrt(math.fsum(float(np.sum(np.square(a.astype(np.float64)))) for a in arrays.values()))


def clip(delta: Arrays, bound: float) -> tuple[Arrays, float]:
    """``delta`` scaled to L2 norm at most ``bound`` (unchanged when already within), and its norm
    before clipping; float64."""
    norm = l2_norm(delta)
    scale = min(1.0, bound / norm) if norm > 0 else 1.0
    return {k: v.astype(np.float64) * scale for k, v in delta.items()}, norm


def privatize(
    start: Arrays, trained: Arrays, p: LocalPrivacy, rng: np.random.Generator
) -> tuple[Arrays, float]:
    """``start + clip(trained - start) + N(0, (noise_multiplier * clip)^2)``, each array in its own
    dtype, and the raw update's norm (kept on the board: it is not released)."""
    delta = {k: trained[k].astype(np.float64) - start[k].astype(np.float64) for k in trained}
    clipped, _ = clip(delta, p.clip)
    std = p.noise_multiplier * p.clip
    out = {
        k: (start[k].astype(np.float64) + clipped[k] + rng.normal(0.0, std, size=clipped[k].shape)).astype(
            trained[k].dtype
        )
        for k in trained
    }
    return out


START_FILE = "privacy-start.npz"  # a private job's starting trained tensors (kept on the board)


def save_arrays(path: Path, arrays: Arrays) -> Path:
    """Write ``arrays`` as an ``.npz`` at ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return path


def load_arrays(path: Path) -> Arrays:
    """The arrays of an ``.npz`` written by :func:`save_arrays`."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
