"""Thin Prefect tasks of the fleet flow over :mod:`tasks.fleet.rounds`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.states import Cancelled, State

from tasks import stages
from tasks.board.inventory import Board
from tasks.errors import Straggler, TrainingFailed
from tasks.fleet import rounds
from tasks.fleet.report import render_fleet_report
from tasks.judge.report import report_key
from tasks.paths import state_dir
from tasks.prefect import boards
from tasks.prefect.limits import ensure_board_limit
from tasks.prepare import Prepared
from tasks.stages import nightly

# runs whose board jobs are being cancelled on purpose (tasks.prefect.buffered.stop_jobs): their
# board tasks end Cancelled, not Failed
STOPPING: set[str] = set()


@task(name="board round", task_run_name="round {r} on {board.name}", cache_policy=NO_CACHE)
def board_round(
    board: Board,
    inp: stages.Inputs,
    prep: Prepared,
    checkpoint: Path,
    run_id: str,
    r: int,
    deadline_wall: float,
    out_dir: Path,
) -> rounds.BoardUpdate | State:
    """One board's part of round ``r``, holding the board's concurrency slot; Straggler when the
    slot, the training or the download is not done by ``deadline_wall`` (a ``time.time()``); a
    Cancelled state when its run stopped the job on purpose (:data:`STOPPING`)."""
    logger = get_run_logger()
    remaining = deadline_wall - time.time()
    if remaining <= 0:
        raise Straggler(f"board {board.name}: round {r}'s deadline passed before it started")
    lease = max(60.0, float(os.environ.get("ODL_BOARD_LEASE_S", "300")))

    def on_event(event: Any) -> None:
        if event.type == "epoch":
            p = event.data
            logger.info(
                "%s epoch %s: train_loss %.4f", board.name, p.get("epoch"), p.get("train_loss", float("nan"))
            )

    try:
        with concurrency(
            ensure_board_limit(board.name),
            occupy=1,
            strict=True,
            lease_duration=lease,
            timeout_seconds=remaining,
        ):
            deadline = time.monotonic() + (deadline_wall - time.time())
            return rounds.board_round(board, inp, prep, checkpoint, run_id, deadline, out_dir, on_event)
    except TimeoutError as exc:
        raise Straggler(f"board {board.name}: its slot stayed busy (another run) until the deadline") from exc
    except TrainingFailed as exc:
        if run_id in STOPPING:  # the buffered mode cancelled it: its last aggregation is made
            return Cancelled(message=f"{board.name}: stopped after the run's last aggregation ({exc})")
        raise


@task(name="aggregate", task_run_name="aggregate round {r}", cache_policy=NO_CACHE)
def close_round(
    fleet: rounds.FleetRun,
    r: int,
    results: dict[str, Any],
    started: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Quorum, aggregation and host evaluation of round ``r`` (FleetError without a quorum)."""
    return fleet.close_round(r, results, started, extra)


def outcome(future: Any) -> Any:
    """A board task's BoardUpdate, or the exception it ended with (None while still running)."""
    future.wait(timeout=0)  # records the final state of a done future (its .state reads the API)
    if not future.state.is_final():
        return None
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - the round records why each board is missing
        return exc


def publish_fleet(summary: dict[str, Any], verdict: str = "", gate: list[str] | None = None) -> str:
    """The fleet report as a markdown artifact (updated each round) and ``$ODL_HOME/reports``."""
    markdown = render_fleet_report(summary, verdict, gate)
    key = report_key(summary["recipe"], summary["group"], "fleet")
    create_markdown_artifact(
        markdown, key=key, description=f"fleet {summary['recipe']} on {summary['group']}"
    )
    folder = state_dir("reports", f"{summary['recipe']}-{summary['group']}")
    (folder / "fleet.md").write_text(markdown)
    return markdown


def mark_boards(summary: dict[str, Any]) -> None:
    """Each board's part of the last round in its record, short lines for the ``odl-boards``
    overview ("fleet r2: OUTLIER" and its kinds, "norm, direction"; the reasons in full are in the
    fleet report)."""
    if not summary["rounds"]:
        return
    rec = summary["rounds"][-1]
    for board, row in rec["boards"].items():
        u = row.get("update")
        if u and u["outlier"]:
            lines = [f"fleet r{rec['round']}: OUTLIER", ", ".join(u["kinds"])]
        else:
            lines = [f"fleet r{rec['round']}: {'ok' if u else row['status']}"]
        boards.seen(board, fleet=lines)


@task(name="rollout", task_run_name="rollout to {board.name}")
def rollout(board: Board, recipe: str, version: str, group: str) -> Any:
    """Install the fleet's promoted version (registered under ``group``) on one of its boards."""
    return nightly.rollout(board, recipe, version, registry_key=group)
