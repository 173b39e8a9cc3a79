"""Warm start: the job's checkpoint carries the weights of the model in service, not the base's.

Any run may warm-start (the ``odl`` flow, a nightly run, a fleet's first round), so it is a stage
of its own::

    warm = warm_start(recipe, prep, board.name)          # -> WarmStart | None

``[training] start_from = "current"`` asks for it. The registry's current version for the recipe
and board is checked against the sha256 recorded with it (a model edited in the registry is
refused), every parameter of the prepared checkpoint is replaced by the initializer of the same
name in that model, and the written checkpoint is read back: the sha256 over its parameters must
equal the one over the model's. The record (version, both hashes, parameter count) goes into the
registry entry of the run, so a reader knows what the candidate grew from.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from tasks.checkpoint import checkpoint_weights, write_checkpoint
from tasks.errors import RegistryError
from tasks.hashing import file_sha256
from tasks.judge.registry import ModelRegistry
from tasks.paths import state_dir
from tasks.prepare import Prepared
from tasks.recipe.schema import Recipe
from tasks.stages.judge import registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmStart:
    """A checkpoint built from a registry version, and what the registry entry records of it."""

    checkpoint: Path
    record: dict[str, Any]


def weights_sha256(weights: dict[str, np.ndarray]) -> str:
    """sha256 over the parameters sorted by name: name, dtype, shape and bytes of each."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        arr = np.ascontiguousarray(weights[name])
        digest.update(json.dumps([name, arr.dtype.str, list(arr.shape)]).encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def model_weights(model: Path) -> dict[str, np.ndarray]:
    """The initializers of an ONNX model (external data loaded) by name."""
    graph = onnx.load(str(model), load_external_data=True).graph
    return {init.name: numpy_helper.to_array(init) for init in graph.initializer}


def build_warm_checkpoint(base: Path, version: Any, out: Path) -> WarmStart:
    """Write ``out``: the prepared checkpoint ``base`` with ``version``'s weights put in it.

    Every parameter of the checkpoint must exist in the version's model with the same shape and
    dtype (else the recipe's model changed since that version: RegistryError naming the
    parameter); nothing else is touched (properties, and no optimizer state: a fresh optimizer).
    """
    _, model_sha = version.verified_files(("model.onnx",), ', or set training.start_from = "base"')[
        "model.onnx"
    ]
    weights = model_weights(version.model)
    params = checkpoint_weights(base)
    taken: dict[str, np.ndarray] = {}
    for name, have in params.items():
        new = weights.get(name)
        if new is None or new.shape != have.shape or new.dtype != have.dtype:
            got = "absent" if new is None else f"{new.dtype}{list(new.shape)}"
            raise RegistryError(
                f'training.start_from = "current": parameter {name!r} of the job\'s checkpoint '
                f"({have.dtype}{list(have.shape)}) is {got} in {version.name}'s model; the recipe's "
                'model changed since that version: set training.start_from = "base" for this run'
            )
        taken[name] = new
    write_checkpoint(base, taken, out, every=True)  # read back and compared tensor by tensor
    expected = weights_sha256(taken)
    record = {
        "from": version.name,
        "model_sha256": model_sha,
        "weights_sha256": expected,
        "parameters": len(params),
        "checkpoint_sha256": file_sha256(out),
    }
    return WarmStart(out, record)


def warm_start(
    recipe: Recipe, prep: Prepared, board: str, reg: ModelRegistry | None = None
) -> WarmStart | None:
    """The job's checkpoint with the current version's weights when ``training.start_from`` is
    "current" and a version is in service; None otherwise (the prepared checkpoint is used)."""
    if recipe.training.start_from != "current":
        return None
    current = (reg or registry()).current(recipe.name, board)
    if current is None:
        log.info("training.start_from = current: no version of %s in service on %s yet, starting "
                 "from the recipe's base weights", recipe.name, board)  # fmt: skip
        return None
    base = prep.checkpoint
    out = state_dir("warm", f"{recipe.name}-{board}-{current.name}-{prep.out_dir.name}") / "checkpoint"
    warm = build_warm_checkpoint(base, current, out)
    log.info("warm start from %s (weights sha256 %s)", current.name, warm.record["weights_sha256"][:12])
    return warm
