"""Host-side stages: the job's inputs and their hash, the job id, the prepared folder and the job spec.

The inputs, their hash and the prepare cache are :mod:`tasks.prepare.pipeline`'s (the one prepare
path, also behind ``odl prepare``); the stages take it cached: the folder
``$ODL_HOME/prepared/<recipe>-<hash12>`` of the job's inputs, each step once. The hash also names
the job on the board (:func:`job_id`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from device_agent.protocol import DataRef, JobSpec
from tasks.prepare import Prepared, pipeline
from tasks.prepare.board_job import build_job_spec
from tasks.prepare.datasets import ensure_datasets
from tasks.prepare.export.torch_model import one_build
from tasks.prepare.pipeline import (
    STEPS,
    Inputs,
    export,
    generate_artifacts,
    inputs,
    prepared,
    recipe_build_hash,
    step_done,
    validate,
)
from tasks.recipe.schema import Recipe
from tasks.stages.rehearse import rehearse_judging

__all__ = [
    "STEPS",
    "Inputs",
    "export",
    "generate_artifacts",
    "inputs",
    "job_id",
    "job_spec",
    "one_build",
    "prepare",
    "prepare_data",
    "prepared",
    "recipe_build_hash",
    "step_done",
    "validate",
]


def prepare_data(recipe: Recipe) -> None:
    """Write the recipe's data files (and base weights) with ``[data].make`` when one is missing."""
    ensure_datasets(recipe)


def prepare(inp: Inputs, *, validate_recipe: bool = True) -> Prepared:
    """Data, export, artifacts and (by default) validation with the judging rehearsal in the inputs'
    folder, each step once: :func:`tasks.prepare.pipeline.prepare` with its cache."""
    return pipeline.prepare(inp, validate=validate_recipe, cache=True, rehearse=rehearse_judging)


def job_id(inp: Inputs, run: str | None = None, extra: str = "") -> str:
    """``<recipe>-<key12>``, or ``<recipe>-<key12>-<run>`` for one run of an orchestrator.

    Without ``run`` the same inputs name the same job, so ``odl run`` after a crash reattaches to
    it; the flow passes its flow-run id, so a retried flow run reattaches to its own job while
    each nightly run trains anew. ``extra`` (the hash of a warm checkpoint or of the pinned board
    files) is mixed into the key: other starting weights or data make another job.
    """
    key = hashlib.sha256((inp.key + extra).encode()).hexdigest() if extra else inp.key
    base = f"{inp.recipe.name}-{key[:12]}"
    tag = "".join(c for c in run or "" if c.isalnum())[:12]
    return f"{base}-{tag}" if tag else base


def job_spec(
    inp: Inputs,
    prep: Prepared,
    job: str,
    *,
    checkpoint: Path | None = None,
    train_data: DataRef | None = None,
) -> tuple[JobSpec, dict[str, Path]]:
    """The board's job spec for ``job`` and the local files it needs, keyed by sha256;
    ``checkpoint`` replaces the prepared one (a warm start), ``train_data`` the recipe's train
    data (the pinned files of a board dataset folder)."""
    return build_job_spec(inp.recipe, prep, job, checkpoint=checkpoint, train_data=train_data)
