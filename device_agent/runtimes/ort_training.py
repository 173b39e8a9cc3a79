"""The ORT-training runtime on the board: ONNX Runtime's training API itself
(``onnxruntime.training.api``, loaded without torch by :func:`device_agent.ort.load_training_api`)
over the training, eval and optimizer graphs the host generated; and, for a training graph with a
random op, the seed ORT's generators are reset to before each step, so a resumed job reproduces an
uninterrupted one.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

from device_agent.errors import AgentError
from device_agent.ort import load_training_api
from device_agent.protocol import ExitCode

# Op types whose kernels draw from ORT's global generators (Dropout and its fused variants,
# the Random* ops, Bernoulli, Multinomial); a graph without any is deterministic.
RANDOM_OPS = (b"Dropout", b"Random", b"Bernoulli", b"Multinomial")


def training_api() -> Any:
    """``onnxruntime.training.api``; NO_TRAINING_API on a board whose ONNX Runtime has none."""
    try:
        return load_training_api()
    except ImportError as exc:
        raise AgentError(ExitCode.NO_TRAINING_API, f"onnxruntime training API unavailable: {exc}") from exc


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
