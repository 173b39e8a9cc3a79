"""Thin Prefect tasks of the fleet flow over :mod:`tasks.fleet.rounds`."""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
from prefect.concurrency.sync import concurrency
from prefect.states import Cancelled, State

from tasks import stages
from tasks.board.inventory import Board
from tasks.errors import Straggler, TrainingFailed
from tasks.fleet import rounds, waves
from tasks.fleet.report import render_fleet_report
from tasks.judge.report import report_key
from tasks.paths import state_dir
from tasks.prefect import boards
from tasks.prefect.limits import ensure_board_limit, ensure_board_limits, forget_board_limits
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

    def on_event(event: Any) -> None:
        if event.type == "epoch":
            p = event.data
            logger.info(
                "%s epoch %s: train_loss %.4f", board.name, p.get("epoch"), p.get("train_loss", float("nan"))
            )

    try:
        return board_part(board, inp, prep, checkpoint, run_id, r, deadline_wall, out_dir, on_event)
    except TrainingFailed as exc:
        if run_id in STOPPING:  # the buffered mode cancelled it: its last aggregation is made
            return Cancelled(message=f"{board.name}: stopped after the run's last aggregation ({exc})")
        raise


WAVE_SLOT_WAIT_S = 10.0  # a wave waits this long for all its boards' slots, then each board for its own


@task(name="boards", task_run_name="round {r}: {name}", cache_policy=NO_CACHE)
def board_wave(
    boards: list[Board],
    inp: stages.Inputs,
    prep: Prepared,
    checkpoint: Path,
    run_id: str,
    r: int,
    deadline_wall: float,
    out_dirs: dict[str, Path],
    name: str = "",
) -> dict[str, Any]:
    """A wave of round ``r`` (:mod:`tasks.fleet.waves`): each board's part, all at once, holding the
    boards' slots in one acquisition (when one of them is busy, each board then waits for its own, as
    a board's part alone does); each board's BoardUpdate or the exception it ended with (Straggler
    past ``deadline_wall``). One line a board in the task's log: what it trained, or why it did not."""
    logger = get_run_logger()
    by_name = {b.name: b for b in boards}
    if deadline_wall - time.time() <= 0:
        return {b: Straggler(f"board {b}: round {r}'s deadline passed before it started") for b in by_name}
    lease = max(60.0, float(os.environ.get("ODL_BOARD_LEASE_S", "300")))
    limits = ensure_board_limits([b.name for b in boards if not queues_jobs(b)])

    def part(board: str, held: bool) -> rounds.BoardUpdate:
        if not held:
            return board_part(
                by_name[board], inp, prep, checkpoint, run_id, r, deadline_wall, out_dirs[board]
            )
        deadline = time.monotonic() + (deadline_wall - time.time())
        return rounds.board_round(by_name[board], inp, prep, checkpoint, run_id, deadline, out_dirs[board])

    try:
        wait_s = min(WAVE_SLOT_WAIT_S, deadline_wall - time.time())
        slots = (concurrency(limits, occupy=1, strict=True, lease_duration=lease, timeout_seconds=wait_s)
                 if limits else nullcontext())  # fmt: skip
        slots.__enter__()
    except (TimeoutError, ConcurrencySlotAcquisitionError) as exc:
        if isinstance(
            exc, ConcurrencySlotAcquisitionError
        ):  # a limit removed by hand: made again, one by one
            forget_board_limits()
        logger.info("a board of this wave is busy (another run holds its slot): each board waits for its own")
        results = waves.run_parts(list(by_name), lambda b: part(b, False))
    else:
        try:
            results = waves.run_parts(list(by_name), lambda b: part(b, True))
        finally:
            slots.__exit__(None, None, None)
    for board, res in results.items():
        if isinstance(res, rounds.BoardUpdate):
            loss = res.metrics.get("train_loss", float("nan"))
            logger.info("%s: %d samples, train_loss %.4f, %.1f s", board, res.samples, loss, res.seconds)
        else:
            logger.info("%s: no update: %s", board, rounds.why(res))
    return results


def board_part(
    board: Board, inp: stages.Inputs, prep: Prepared, checkpoint: Path, run_id: str, r: int,
    deadline_wall: float, out_dir: Path, on_event: Any = None,
) -> rounds.BoardUpdate:  # fmt: skip
    """One board's part holding its own slot unless it queues its jobs itself (:func:`queues_jobs`);
    Straggler when the slot stays busy until the deadline."""
    remaining = deadline_wall - time.time()
    if remaining <= 0:
        raise Straggler(f"board {board.name}: round {r}'s deadline passed before it started")
    lease = max(60.0, float(os.environ.get("ODL_BOARD_LEASE_S", "300")))
    try:
        slot = nullcontext() if queues_jobs(board) else concurrency(
            ensure_board_limit(board.name), occupy=1, strict=True, lease_duration=lease, timeout_seconds=remaining)  # fmt: skip
        with slot:
            deadline = time.monotonic() + (deadline_wall - time.time())
            return rounds.board_round(board, inp, prep, checkpoint, run_id, deadline, out_dir, on_event)
    except TimeoutError as exc:
        raise Straggler(f"board {board.name}: its slot stayed busy (another run) until the deadline") from exc


def queues_jobs(board: Board) -> bool:
    """Whether the board itself runs its jobs one at a time in the order they come, so that its part
    of a round needs no server-wide slot: a pull-mode board takes its mailbox's jobs and starts one
    only when none runs (the agent's job lock: a second waits), the mailbox is its queue; the slot
    would only add requests and events a board (acquisition, lease, release) to the Prefect server."""
    return board.transport == "pull"


def wave_outcomes(future: Any, boards: list[Board]) -> dict[str, Any]:
    """A wave task's outcomes by board: its result; the exception it ended with for each of its
    boards; None for each while it still runs."""
    got = outcome(future)
    if isinstance(got, dict):
        return {b.name: got.get(b.name) for b in boards}
    return {b.name: got for b in boards}


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
