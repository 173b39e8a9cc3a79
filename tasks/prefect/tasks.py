"""Thin Prefect tasks over the plain stage functions: names a user understands, retries, caching.

* Retries happen only for errors whose ``retryable`` is true (link down, timeout, transfer) through
  ``retry_condition_fn``; invalid input and failed training are never retried.
* export / generate artifacts / validate recipe are cached on their inputs and source
  (``INPUTS + TASK_SOURCE``, persisted results). Their inputs are the recipe path, the overrides and
  the sha256 of every file the recipe reads, so an unchanged nightly run shows them as ``Cached``.
* deploy skips blobs the board already has; training always runs (never cached).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE

from device_agent.protocol import file_sha256
from tasks.errors import PipelineError
from tasks.recipe.load import load_recipe
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
CACHED = INPUTS + TASK_SOURCE


def retry_if_retryable(task: Any, task_run: Any, state: Any) -> bool:
    """``retry_condition_fn``: retry only a PipelineError whose ``retryable`` is true."""
    try:
        state.result()
    except PipelineError as exc:
        return bool(exc.retryable)
    except Exception:
        return False
    return False


RETRY = {"retries": 2, "retry_delay_seconds": 5, "retry_condition_fn": retry_if_retryable}


def input_hashes(recipe: Recipe) -> dict[str, str]:
    """sha256 of the recipe file, its data and weights files and a callable model's module source."""
    from tasks.recipe.datafiles import recipe_files

    files = {"recipe": recipe.source, **recipe_files(recipe)}
    if recipe.model.kind == "callable":
        module = recipe.model.ref.split(":", 1)[0].replace(".", "/") + ".py"
        files["model.callable"] = recipe.base_dir / module
    elif recipe.model.kind == "onnx":
        files["model.onnx"] = Path(recipe.model.ref)
    return {k: file_sha256(p) for k, p in sorted(files.items()) if Path(p).is_file()}


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Call ``fn`` and return its value with the wall-clock seconds it took."""
    t0 = time.perf_counter()
    return fn(*args, **kwargs), time.perf_counter() - t0


@task(name="prepare data")
def data_task(recipe_path: str, overrides: dict[str, Any]) -> None:
    """Write the recipe's datasets (and base weights) when missing: [data].make, run once."""
    from tasks.recipe.datafiles import ensure_datasets

    ensure_datasets(load_recipe(recipe_path, overrides))


@task(name="export", cache_policy=CACHED, persist_result=True, **RETRY)
def export_task(recipe_path: str, overrides: dict[str, Any], hashes: dict[str, str], work_dir: str) -> str:
    """Export the recipe's model to ``work_dir/model.onnx`` (training mode); returns the path."""
    from tasks.prepare.export import export_model

    return str(export_model(load_recipe(recipe_path, overrides), Path(work_dir)))


@task(name="generate artifacts", cache_policy=CACHED, persist_result=True, **RETRY)
def artifacts_task(
    recipe_path: str, overrides: dict[str, Any], hashes: dict[str, str], work_dir: str, model_sha256: str
) -> dict[str, Any]:
    """Generate the ORT training artifacts and the manifest in ``work_dir``; returns the manifest."""
    from tasks.prepare.artifacts import generate

    return generate(load_recipe(recipe_path, overrides), Path(work_dir) / "model.onnx", Path(work_dir))


@task(name="validate recipe", cache_policy=CACHED, persist_result=True, **RETRY)
def validate_task(
    recipe_path: str, overrides: dict[str, Any], hashes: dict[str, str], work_dir: str, manifest_sha256: str
) -> dict[str, Any]:
    """Dry-run the recipe on the host with the generated artifacts; returns the validation report."""
    from tasks.prepare.validate import validate

    return validate(load_recipe(recipe_path, overrides), Path(work_dir))


def manifest_sha(work_dir: Path) -> str:
    """sha256 of ``work_dir/manifest.json`` (the cache input of the validation)."""
    return file_sha256(Path(work_dir) / "manifest.json")


class BoardProgress:
    """``on_event`` callback: board events -> flow-run log lines and a Prefect progress artifact."""

    # Each update is a write to Prefect's API; on the embedded SQLite server frequent writes contend
    # with the server's own writers (503s, slow answers), so the UI's progress moves every 2 s at most.
    def __init__(self, board: str, epochs: int, artifact_id: Any, min_interval_s: float = 2.0) -> None:
        self.board, self.epochs, self.artifact_id = board, max(epochs, 1), artifact_id
        self.min_interval_s, self.last_update, self.percent = min_interval_s, 0.0, 0.0
        self.shown = 0.0  # the value the artifact shows now
        self.total_steps: int | None = None
        self.events: list[Any] = []

    def __call__(self, event: Any) -> None:
        """Record the event, log a progress line and move the progress artifact."""
        from prefect.logging import get_run_logger

        self.events.append(event)
        data = event.data or {}
        self.total_steps = data.get("total_steps", self.total_steps)
        if event.type == "step" and self.total_steps:
            self.percent = max(self.percent, 100.0 * data.get("step", 0) / self.total_steps)
        elif event.type == "epoch":
            self.percent = max(self.percent, 100.0 * data.get("epoch", 0) / self.epochs)
        if event.type != "step" or self.total_steps is None:
            get_run_logger().info("board %s: %s %s", self.board, event.type, _brief(data))
        self._update(force=event.type in ("finished", "failed"))

    def _update(self, force: bool = False) -> None:
        from prefect.artifacts import update_progress_artifact

        value = round(min(self.percent, 100.0), 1)
        if value == self.shown:
            return
        if force or time.monotonic() - self.last_update >= self.min_interval_s:
            update_progress_artifact(self.artifact_id, value)
            self.last_update, self.shown = time.monotonic(), value

    def done(self) -> None:
        """Set the artifact to 100 % once the result is in."""
        self.percent = 100.0
        self._update(force=True)


def _brief(data: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in data.items()
        if isinstance(v, (int, float, str))
    )


@task(name="deploy", task_run_name="deploy to {board_name}", **RETRY)
def deploy_task(board_name: str, memory_estimate_mb: float, files: dict[str, str]) -> dict[str, Any]:
    """Install/check the agent and upload the blobs the board lacks (skips unchanged ones)."""
    from tasks.board import agent, blobs
    from tasks.board.inventory import get_board
    from tasks.board.transport import connect

    board = get_board(board_name)
    conn = connect(board)
    try:
        info = agent.install_agent(conn, board, memory_estimate_mb)
        report = blobs.upload_blobs(conn, board, {sha: Path(p) for sha, p in files.items()})
    finally:
        conn.close()
    return {
        "uploaded": len(report.uploaded),
        "skipped": len(report.skipped),
        "bytes_sent": report.bytes_sent,
        "agent": info,
    }


@task(name="train", task_run_name="train on {board_name}", **RETRY)
def train_task(board_name: str, spec_json: str, files: dict[str, str], progress_key: str) -> dict[str, Any]:
    """Run (or reattach to) the job on the board, streaming progress; returns the JobResult and events."""
    from prefect.artifacts import create_progress_artifact

    from device_agent.protocol import JobSpec
    from tasks.board import run
    from tasks.board.inventory import get_board

    spec = JobSpec.from_json(spec_json)
    artifact_id = create_progress_artifact(
        0.0, key=progress_key, description=f"training {spec.job_id} on {board_name}"
    )
    progress = BoardProgress(board_name, spec.train.epochs, artifact_id)
    result = run.train(  # the deploy task has just installed the agent and uploaded the blobs
        get_board(board_name), spec, {s: Path(p) for s, p in files.items()}, on_event=progress, deployed=True
    )
    progress.done()
    return {
        "result": result.to_dict(),
        "events": [{"type": e.type, "seq": e.seq, "data": e.data} for e in progress.events],
    }


@task(name="retrieve", task_run_name="retrieve from {board_name}", **RETRY)
def retrieve_task(board_name: str, job_id: str, result: dict[str, Any], out_dir: str) -> str:
    """Download the trained inference model and check it against the sha256 in ``result.json``."""
    from device_agent.protocol import JobResult
    from tasks.board.inventory import get_board
    from tasks.board.retrieve import retrieve

    got = retrieve(get_board(board_name), job_id, JobResult.from_dict(result), Path(out_dir))
    if "inference" not in got:
        raise PipelineError(f"job {job_id}: result.json lists no 'inference' output (has {sorted(got)})")
    return str(got["inference"])


@task(name="evaluate")
def evaluate_task(
    recipe_path: str, overrides: dict[str, Any], work_dir: str, candidate: str, current: str | None
) -> dict[str, Any]:
    """Evaluate base, current (if any) and candidate models on the test set and the extra test sets."""
    from tasks.judge.evaluate import base_inference_model, evaluate_cached
    from tasks.paths import state_dir

    recipe = load_recipe(recipe_path, overrides)
    work = Path(work_dir)
    manifest = json.loads((work / "manifest.json").read_text())
    arts = work / "artifacts"
    base = base_inference_model(
        arts / "training_model.onnx",
        arts / "eval_model.onnx",
        arts / "checkpoint",
        manifest["inference_output_names"],
        work / "base_inference.onnx",
    )
    models = {"base": base, **({"current": Path(current)} if current else {}), "candidate": Path(candidate)}
    sets = {"test": recipe.data.test, **recipe.data.extra_tests}
    cache = state_dir("cache", "evaluations")
    return {
        name: {col: evaluate_cached(m, path, recipe.task, cache) for col, m in models.items()}
        for name, path in sets.items()
    }


@task(name="promote")
def promote_task(
    recipe_name: str,
    board_name: str,
    rule: dict[str, Any],
    evaluations: dict[str, dict[str, Any]],
    candidate: str,
    manifest: str,
    info: dict[str, Any],
    registry_root: str,
) -> dict[str, Any]:
    """Record the candidate in the registry; it becomes ``current`` only if it beats the reference."""
    from dataclasses import asdict

    from tasks.judge.registry import Registry, decide
    from tasks.recipe.schema import PromotionSpec

    reg = Registry(Path(registry_root))
    cur = reg.current(recipe_name, board_name)
    ref_name = cur.name if cur else "base"
    reference = evaluations["current"] if cur and "current" in evaluations else evaluations["base"]
    decision = decide(evaluations["candidate"], reference, PromotionSpec(**rule), ref_name)
    version = reg.record(
        recipe_name,
        board_name,
        Path(candidate),
        evaluations["candidate"],
        decision,
        info=info,
        manifest=Path(manifest),
    )
    return {"decision": asdict(decision), "version": version.name}


def prepared_in(work_dir: Path) -> Any:
    """The ``Prepared`` value of a work folder filled by the export/artifacts/validate tasks."""
    from tasks.prepare import Prepared

    work = Path(work_dir)
    validation = work / "validation.json"
    return Prepared(
        out_dir=work,
        model_onnx=work / "model.onnx",
        artifacts_dir=work / "artifacts",
        manifest_path=work / "manifest.json",
        validation_path=validation,
        manifest=json.loads((work / "manifest.json").read_text()),
        validation=json.loads(validation.read_text()) if validation.is_file() else None,
    )
