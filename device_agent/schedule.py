"""What a training step depends on besides the weights: its learning rate (a function of the step
number) and, for a graph with a random op, the seed ORT's generators are reset to before it — so a
resumed job reproduces an uninterrupted one."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

from device_agent.protocol import TrainParams

# Op types whose kernels draw from ORT's global generators (Dropout and its fused variants,
# the Random* ops, Bernoulli, Multinomial); a graph without any is deterministic.
RANDOM_OPS = (b"Dropout", b"Random", b"Bernoulli", b"Multinomial")


def lr_at(step: int, total: int, p: TrainParams) -> float:
    """Linear warm-up to ``p.lr`` over ``warmup_steps``, then linear decay to ``lr*final_lr_ratio``."""
    if step < p.warmup_steps:
        return p.lr * (step + 1) / p.warmup_steps
    span = max(1, total - p.warmup_steps - 1)
    frac = min(1.0, (step - p.warmup_steps) / span)
    return p.lr * (1.0 - frac * (1.0 - p.final_lr_ratio))


def has_random_ops(model: Path) -> bool:
    """Whether an ONNX file may hold a random op (its op type names are stored verbatim).

    True when the file cannot be read: seeding is then done as if it had one.
    """
    try:
        with open(model, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return any(data.find(op) >= 0 for op in RANDOM_OPS)
    except (OSError, ValueError):
        return True


def step_seeder(model: Path) -> Any:
    """ORT's ``set_seed`` when the training graph ``model`` has a random op, else None.

    Re-seeding before every step makes a Dropout mask a function of the step number (ORT's
    Dropout draws from a global Philox generator that ``set_seed`` resets), which a resumed job
    needs to reproduce an uninterrupted one. Without a random op it changes nothing.
    """
    if not has_random_ops(model):
        return None
    from onnxruntime.capi import _pybind_state as capi  # lazy: ORT loads through device_agent.ort only

    return getattr(capi, "set_seed", None)
