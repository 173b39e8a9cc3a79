"""The whole pipeline from the command line: prepare -> deploy -> train -> retrieve.

``run_pipeline`` is a plain function (the ``odl run`` command and the Prefect flow call it).
The job id defaults to ``<recipe name>-<hash of the job's inputs>``: re-running the same
command after the host was killed reattaches to the job already on the board instead of
training again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device_agent.protocol import Event, JobResult
from tasks.board.inventory import get_board
from tasks.board.transport import Progress, connect
from tasks.hashing import file_sha256
from tasks.paths import odl_home
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    """What one ``odl run`` did: where, which job, what was sent, what came back."""

    job_id: str
    board: str
    out_dir: Path
    prepared_dir: Path
    result: JobResult
    files: dict[str, Path]
    bytes_uploaded: int = 0
    blobs_skipped: int = 0
    events: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (paths as strings)."""
        return {
            "job_id": self.job_id,
            "board": self.board,
            "out_dir": str(self.out_dir),
            "prepared_dir": str(self.prepared_dir),
            "bytes_uploaded": self.bytes_uploaded,
            "blobs_skipped": self.blobs_skipped,
            "events": self.events,
            "files": {k: str(v) for k, v in self.files.items()},
            "result": self.result.to_dict(),
        }


def input_hash(recipe: Recipe) -> str:
    """sha256 over the recipe (canonical) and the host files it trains from (weights, data)."""
    from tasks.recipe.load import recipe_hash

    digest = hashlib.sha256(recipe_hash(recipe).encode())
    paths = [recipe.model.weights, recipe.data.train, recipe.data.eval]
    if recipe.model.kind == "onnx":
        paths.append(Path(recipe.model.ref))
    for path in paths:
        digest.update(file_sha256(path).encode() if path and Path(path).exists() else b"-")
    return digest.hexdigest()


def default_job_id(recipe: Recipe) -> str:
    """``<recipe name>-<12 hex of input_hash>``: the same inputs give the same job."""
    return f"{recipe.name}-{input_hash(recipe)[:12]}"


def prepare_cached(recipe: Recipe, *, validate: bool = True):  # noqa: ANN201 - tasks.prepare.Prepared
    """``prepare`` into ``$ODL_HOME/prepared/<name>-<recipe hash>``, reused when already complete."""
    from tasks.prepare import Prepared, prepare
    from tasks.recipe.load import recipe_hash

    out = odl_home() / "prepared" / f"{recipe.name}-{recipe_hash(recipe)[:12]}"
    manifest, validation = out / "manifest.json", out / "validation.json"
    done = out / ".complete"
    if done.exists() and manifest.exists() and (validation.exists() or not validate):
        log.info("reusing prepared artifacts in %s", out)
        return Prepared(
            out,
            out / "model.onnx",
            out / "artifacts",
            manifest,
            validation,
            json.loads(manifest.read_text()),
            json.loads(validation.read_text()) if validation.exists() else None,
        )
    prepared = prepare(recipe, out, validate=validate)
    done.write_text("ok\n")
    return prepared


def run_pipeline(
    recipe_path: Path | str,
    board_name: str,
    out_dir: Path | None = None,
    *,
    job_id: str | None = None,
    overrides: dict[str, object] | None = None,
    on_event: Callable[[Event], None] | None = None,
    progress: Progress | None = None,
    validate: bool = True,
) -> RunSummary:
    """Prepare the recipe, deploy to ``board_name``, train there (or reattach), retrieve the outputs."""
    from tasks.board import jobs, run
    from tasks.board.retrieve import retrieve
    from tasks.prepare.jobspec import build_job_spec
    from tasks.recipe.load import load_recipe

    board = get_board(board_name)
    recipe = load_recipe(recipe_path, overrides)
    job_id = job_id or default_job_id(recipe)
    jobs.job_dir(board, job_id)  # refuse an unsafe id before anything runs
    prepared = prepare_cached(recipe, validate=validate)
    spec, files = build_job_spec(recipe, prepared, job_id)
    out_dir = Path(out_dir or odl_home() / "runs" / job_id)
    counter = _Counter(on_event)
    conn = connect(board)
    try:
        report, result = run.run_job(conn, board, spec, files, counter, progress)
        got = retrieve(conn, job_id, result, out_dir, board)
    finally:
        conn.close()
    summary = RunSummary(
        job_id,
        board.name,
        out_dir,
        prepared.out_dir,
        result,
        got,
        report.bytes_sent,
        len(report.skipped),
        counter.count,
    )
    (out_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2, default=str))
    return summary


class _Counter:
    """Counts events and passes them on."""

    def __init__(self, on_event: Callable[[Event], None] | None) -> None:
        self.on_event, self.count = on_event, 0

    def __call__(self, event: Event) -> None:
        self.count += 1
        if self.on_event:
            self.on_event(event)
