"""One job on a board without Prefect (``odl run``): prepare -> deploy -> train -> retrieve.

It composes the same stages as the flow; the job id is the recipe name and the hash of the job's
inputs, so running it again with the same inputs reattaches to the job already on the board.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from device_agent.protocol import Event
from tasks.board.inventory import get_board
from tasks.board.jobs import job_dir
from tasks.paths import odl_home
from tasks.recipe.load import load_recipe
from tasks.stages.board import Deployment, Retrieved, Training, deploy, retrieve, train
from tasks.stages.prepare import inputs, job_id, job_spec, prepare, prepare_data


class Observer(Protocol):
    """Who watches a run as it goes (``odl run``'s progress bars)."""

    def upload(self, done: int, total: int) -> None: ...
    def event(self, event: Event) -> None: ...
    def download(self, done: int, total: int) -> None: ...


@dataclass(frozen=True)
class RunSummary:
    """What one ``odl run`` did: the job, what was sent, what came back and where it is."""

    job_id: str
    board: str
    out_dir: Path
    prepared_dir: Path
    deployment: Deployment
    training: Training
    retrieved: Retrieved

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly summary (written as ``summary.json`` beside the outputs)."""
        return {
            "job_id": self.job_id,
            "board": self.board,
            "out_dir": str(self.out_dir),
            "prepared_dir": str(self.prepared_dir),
            "bytes_uploaded": self.deployment.bytes_sent,
            "blobs_skipped": len(self.deployment.skipped),
            "events": len(self.training.events),
            "files": {k: str(v) for k, v in self.retrieved.files.items()},
            "result": self.training.result.to_dict(),
        }


def run_on_board(
    recipe_path: Path | str,
    board_name: str,
    out_dir: Path | None = None,
    *,
    job: str | None = None,
    overrides: dict[str, object] | None = None,
    validate: bool = True,
    observer: Observer | None = None,
) -> RunSummary:
    """Prepare the recipe, deploy to ``board_name``, train there (or reattach), retrieve the outputs;
    ``observer`` sees the upload, the board's events and the download."""
    board = get_board(board_name)
    recipe = load_recipe(Path(recipe_path).expanduser().resolve(), overrides)
    prepare_data(recipe)
    inp = inputs(recipe)
    job = job or job_id(inp)
    job_dir(board, job)  # refuse an unsafe id before anything runs
    prep = prepare(inp, validate_recipe=validate)
    spec, files = job_spec(inp, prep, job)
    out_dir = Path(out_dir or odl_home() / "runs" / job)
    deployment = deploy(board, spec, files, progress=observer.upload if observer else None)
    training = train(board, spec, files, on_event=observer.event if observer else None)
    retrieved = retrieve(board, training, out_dir, progress=observer.download if observer else None)
    summary = RunSummary(job, board.name, out_dir, prep.out_dir, deployment, training, retrieved)
    (out_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2, default=str))
    return summary
