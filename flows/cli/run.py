"""``odl run RECIPE --board NAME``: prepare -> deploy -> train on the board -> retrieve, no Prefect.

It composes the same stages as the flow (:mod:`tasks.stages`); ``odl flow`` runs the whole Prefect
flow in-process, evaluation and promotion included. The job id is the recipe name and the hash of
the job's inputs, so re-running the same command reattaches to the job already on the board.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from flows.cli.progress import Bars
from tasks import stages
from tasks.paths import odl_home


@dataclass(frozen=True)
class RunSummary:
    """What one ``odl run`` did: the job, what was sent, what came back and where it is."""

    job_id: str
    board: str
    out_dir: Path
    prepared_dir: Path
    deployment: stages.Deployment
    training: stages.Training
    retrieved: stages.Retrieved

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
    bars: Bars | None = None,
) -> RunSummary:
    """Prepare the recipe, deploy to ``board_name``, train there (or reattach), retrieve the outputs."""
    from tasks.board.inventory import get_board
    from tasks.board.jobs import job_dir
    from tasks.recipe.load import load_recipe

    board = get_board(board_name)
    recipe = load_recipe(Path(recipe_path).expanduser().resolve(), overrides)
    stages.prepare_data(recipe)
    inp = stages.inputs(recipe)
    job = job or stages.job_id(inp)
    job_dir(board, job)  # refuse an unsafe id before anything runs
    prep = stages.prepare(inp, validate_recipe=validate)
    spec, files = stages.job_spec(inp, prep, job)
    out_dir = Path(out_dir or odl_home() / "runs" / job)
    bars = bars or Bars(enabled=False)
    deployment = stages.deploy(board, spec, files, progress=bars.upload)
    training = stages.train(board, spec, files, on_event=bars.event)
    retrieved = stages.retrieve(board, training, out_dir, progress=bars.download)
    summary = RunSummary(job, board.name, out_dir, prep.out_dir, deployment, training, retrieved)
    (out_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2, default=str))
    return summary


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``odl run`` to the ``odl`` parser."""
    p = sub.add_parser("run", help="prepare, deploy, train on a board and retrieve (no Prefect)")
    p.add_argument("recipe", type=Path, help="recipe TOML file (relative to the current folder)")
    p.add_argument("--board", required=True, help="board name in the inventory")
    p.add_argument("--out", type=Path, help="output folder (default $ODL_HOME/runs/JOB_ID)")
    p.add_argument("--job-id", help="job id (default: recipe name + hash of the job's inputs)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe field (TOML value)")
    p.add_argument("--no-validate", action="store_true", help="skip the host dry-run of the recipe")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from tasks.recipe.load import parse_override

    overrides = dict(parse_override(text) for text in args.set or [])
    with Bars() as bars:
        summary = run_on_board(
            args.recipe,
            args.board,
            args.out,
            job=args.job_id,
            overrides=overrides,
            validate=not args.no_validate,
            bars=bars,
        )
    r = summary.training.result
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(r.metrics.items()))
    print(
        f"job {summary.job_id} on {summary.board}: {r.status}, {r.steps} steps, {r.epochs_done} epochs "
        f"in {r.duration_s:.1f} s; {metrics}"
    )
    d = summary.deployment
    print(f"uploaded {d.bytes_sent} bytes ({len(d.skipped)} blob(s) already on the board)")
    print(f"outputs in {summary.out_dir}")
    return 0
