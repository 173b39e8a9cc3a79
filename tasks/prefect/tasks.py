"""Thin Prefect tasks over :mod:`tasks.stages`: a name a user understands, retries, caching, logs.

* Retries happen only for errors the one retry policy calls retryable (link down, timeout,
  transfer); invalid input and failed training are never retried.
* export / generate artifacts / validate recipe are cached on the job's input hash
  (:attr:`tasks.stages.Inputs.key`, which also covers the preparation code), and only while their
  folder still holds the step's output, so an unchanged nightly run shows them as ``Cached``.
* deploy skips blobs the board already has; training always runs (never cached).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_progress_artifact
from prefect.cache_policies import CacheKeyFnPolicy

from tasks import stages
from tasks.board.inventory import Board
from tasks.errors import DeviceUnreachable, NoNewData, should_retry
from tasks.judge.decision import headline
from tasks.prefect import boards
from tasks.prefect.logs import board_link_lines
from tasks.prefect.progress import BoardProgress, terminal
from tasks.prepare import Prepared
from tasks.recipe.schema import Recipe
from tasks.stages import nightly
from tasks.stages import warm_start as warm
from tasks.stages.rehearse import rehearse_judging


def retry_if_retryable(task: Any, task_run: Any, state: Any) -> bool:
    """``retry_condition_fn``: retry only what :func:`tasks.errors.should_retry` allows."""
    try:
        state.result()
    except Exception as exc:
        return should_retry(exc)
    return False


RETRY = {"retries": 2, "retry_delay_seconds": 5, "retry_condition_fn": retry_if_retryable}


def _cached_step(step: str) -> Any:
    """Cache on the input hash (which covers the preparation code too); :func:`prepare_step`
    refreshes the cache when the step's output is not on disk."""

    def key(_ctx: Any, params: dict[str, Any]) -> str:
        inp: stages.Inputs = params["inp"]
        return f"{step}-{inp.key}"

    return {"cache_policy": CacheKeyFnPolicy(cache_key_fn=key), "persist_result": True}


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Call ``fn`` and return its value with the wall-clock seconds it took."""
    t0 = time.perf_counter()
    return fn(*args, **kwargs), time.perf_counter() - t0


def said(line: str, t0: float) -> None:
    """The stage's one line in the run's logs: what it did and in how many seconds."""
    from prefect.logging import get_run_logger  # inside a task run

    get_run_logger().info("%s (%.1f s)", line, time.perf_counter() - t0)


@task(name="prepare data", task_run_name="prepare data")
def prepare_data(recipe: Recipe) -> None:
    """Write the recipe's datasets (and base weights) when missing: [data].make, run once."""
    t0 = time.perf_counter()
    stages.prepare_data(recipe)
    d = recipe.data
    sets = [p for p in (d.train, d.eval, d.test, *d.extra_tests.values()) if p is not None]
    said(f"data ready: {len(sets)} host data sets ({', '.join(p.name for p in sets)})", t0)


@task(name="export", task_run_name="export", **_cached_step("export"), **RETRY)
def export(inp: stages.Inputs) -> Path:
    """Export the recipe's model to ONNX (training mode)."""
    t0 = time.perf_counter()
    out = stages.export(inp)
    said(f"exported {out.name} ({out.stat().st_size / 1024:.0f} KiB, training mode, dynamic batch)", t0)
    return out


@task(name="generate artifacts", task_run_name="generate artifacts", **_cached_step("artifacts"), **RETRY)
def generate_artifacts(inp: stages.Inputs) -> dict[str, Any]:
    """Generate the training artifacts (the runtime's) and the manifest."""
    t0 = time.perf_counter()
    manifest = stages.generate_artifacts(inp)
    files = ("train and eval steps, the inference template and the checkpoint (autograd)"
             if manifest.get("runtime") == "autograd"
             else "training, eval and optimizer graphs and the checkpoint (ort-training)")  # fmt: skip
    said(f"{files}: {manifest.get('trainable_count', '?')} trainable parameters, loss {manifest.get('loss', '?')}",
         t0)  # fmt: skip
    return manifest


@task(name="validate recipe", task_run_name="validate recipe", **_cached_step("validate"), **RETRY)
def validate(inp: stages.Inputs) -> dict[str, Any]:
    """Dry-run the recipe on the host with the generated artifacts and rehearse the judging."""
    t0 = time.perf_counter()
    report = stages.validate(inp, rehearse_judging)
    checks = report.get("checks") or {}
    said(f"offline validation {'passed' if report.get('passed') else 'FAILED'}: {len(checks)} checks", t0)
    return report


@task(name="deploy", task_run_name="deploy to {board.name}", **RETRY)
def deploy(board: Board, spec: Any, files: dict[str, Path]) -> stages.Deployment:
    """Install/check the agent and upload the blobs the board lacks (a heartbeat of the board)."""
    t0 = time.perf_counter()
    try:
        done = stages.deploy(board, spec, files, progress=terminal().upload)
    except DeviceUnreachable:
        boards.heartbeat(board.name, False)
        raise
    boards.heartbeat(board.name, True, boards.free_space(done.info))  # the overview's disk and RAM
    said(f"deployed job {spec.job_id} to {board.name}: {len(done.uploaded)} file(s) uploaded "
         f"({done.bytes_sent} bytes), {len(done.skipped)} already on the board", t0)  # fmt: skip
    return done


@task(name="train", task_run_name="train on {board.name}", **RETRY)
def train(board: Board, spec: Any, files: dict[str, Path], progress_key: str) -> stages.Training:
    """Run (or reattach to) the job on the board, streaming progress to the UI and the terminal."""
    artifact_id = create_progress_artifact(
        0.0, key=progress_key, description=f"training {spec.job_id} on {board.name}"
    )
    progress = BoardProgress(board.name, spec.train.epochs, artifact_id, echo=terminal().event)
    # the flow holds the board's concurrency slot: a job training there belongs to no live run
    with board_link_lines():
        training = stages.train(board, spec, files, on_event=progress, end_orphans=True)
    progress.done()
    return training


@task(name="retrieve", task_run_name="retrieve from {board.name}", **RETRY)
def retrieve(board: Board, training: stages.Training, out_dir: Path) -> stages.Retrieved:
    """Download the trained inference model (and the job's result, events and log), verified
    against ``result.json``. The job's other outputs, its final checkpoint with the optimizer's state
    and its trainable tensors, stay on the board: nothing on the host reads them after a run (a warm
    start is built from the registry's model), and for a model trained whole they are several times
    the model's bytes over the board's link."""
    t0 = time.perf_counter()
    retrieved = stages.retrieve(board, training, out_dir, progress=terminal().download, only=("inference",))
    size = retrieved.inference.stat().st_size  # fails the task now when the model is missing
    said(f"retrieved {', '.join(sorted(retrieved.files))} of job {training.job_id} into {out_dir} "
         f"(the model {size / 1e6:.1f} MB, sha256 verified)", t0)  # fmt: skip
    return retrieved


@task(name="evaluate", task_run_name="evaluate")
def evaluate(
    recipe: Recipe,
    prep: Prepared,
    candidate: Path,
    reference: stages.Reference,
    learnt: Sequence[str] = (),
) -> stages.Evaluation:
    """Evaluate base, current (if any) and candidate on the test set, the extra test sets and the
    held-out parts of the ``learnt`` board shards."""
    t0 = time.perf_counter()
    done = stages.evaluate(recipe, prep, candidate, reference, learnt)
    metric = recipe.promotion.metric
    figures = ", ".join(
        f"{col} {m[metric]:.4f}" for col, m in done.test.items() if isinstance(m.get(metric), (int, float))
    )
    said(f"evaluated {', '.join(done.test)} on the test set and {len(done.sets) - 1} more set(s): "
         f"{metric} {figures or 'not reported'}", t0)  # fmt: skip
    return done


@task(name="promote", task_run_name="promote")
def promote(
    recipe: Recipe,
    board: str,
    evaluation: stages.Evaluation,
    candidate: Path,
    prep: Prepared,
    info: dict[str, Any],
) -> stages.Promotion:
    """Record the candidate in the registry; it becomes current only if it beats the reference."""
    t0 = time.perf_counter()
    done = stages.promote(recipe, board, evaluation, candidate, prep, info)
    d = done.decision
    boards.emit("odl.model.promoted" if d.promote else "odl.model.rejected", board,
                {"recipe": recipe.name, "version": done.version, "metric": d.metric, "candidate": d.candidate,
                 "reference": d.reference, "reference_name": d.reference_name, "reason": d.reason})  # fmt: skip
    verdict = "promoted: now current" if d.promote else "not promoted: current unchanged"
    said(f"recorded {done.version} in the registry, {verdict} ({headline(d)})", t0)
    return done


@task(name="board data", task_run_name="list data on {board.name}", **RETRY)
def board_data(recipe: Recipe, board: Board) -> Any:
    """List the board's dataset folder and pin the files this run trains on (None: host data);
    the reason as a string when there is nothing new to train on (the run ends "No new data")."""
    try:
        return nightly.board_data(recipe, board)
    except NoNewData as exc:
        return str(exc)


@task(name="warm start", task_run_name="warm start")
def warm_start(recipe: Recipe, prep: Prepared, board: str) -> Any:
    """The job's checkpoint from the model in service (``training.start_from = "current"``)."""
    return warm.warm_start(recipe, prep, board)


@task(name="rollout", task_run_name="rollout to {board.name}", **RETRY)
def rollout(board: Board, recipe: str, version: str) -> Any:
    """Install the promoted version as the board's models/<recipe>/current, hash-verified."""
    t0 = time.perf_counter()
    with board_link_lines():
        done = nightly.rollout(board, recipe, version)
    said(f"{board.name} serves {version} as models/{recipe}/current (previous {done.previous or 'none'})", t0)
    boards.emit("odl.model.rolled-out", board.name, {"recipe": recipe, "version": version})
    return done


PREPARE_STEPS = {"export": export, "artifacts": generate_artifacts, "validate": validate}
PREPARE_LABELS = {"export": "export", "artifacts": "generate artifacts", "validate": "validate recipe"}


def prepare_step(step: str, inp: stages.Inputs) -> Any:
    """Run one cached preparation task: ``Cached`` when its output for these inputs is on disk,
    run again (and re-cached) when it is not (new inputs, a removed folder)."""
    refresh = not stages.step_done(inp, step)
    return PREPARE_STEPS[step].with_options(refresh_cache=refresh)(inp)


def prepare_steps(inp: stages.Inputs) -> dict[str, float]:
    """The cached preparation tasks in order (export, artifacts, validate) as one preparation: the
    PyTorch model is built, its weights loaded and its BatchNorm statistics measured once for the
    three (:func:`tasks.stages.one_build`; each task built it again: a U-Net with 64 calibration
    images measured them three times a run, 3.8 + 3.0 + 2.0 s); each task's seconds by its label."""
    with stages.one_build():
        return {label: timed(prepare_step, step, inp)[1] for step, label in PREPARE_LABELS.items()}
