"""The fleet flow's buffered asynchronous mode on Prefect (``[fleet] mode = "buffered"``): one board
task per job, a new one for each board as soon as a newer global version exists, an aggregation
task every ``buffer_size`` arrivals (:mod:`tasks.fleet.buffered` holds the arithmetic and the
records). When the last aggregation is made, the jobs still training are cancelled on their
boards (only this run's: their ids end with the run's tag)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait

from tasks import stages
from tasks.board.inventory import Board
from tasks.board.joblink import job_link
from tasks.errors import FleetError
from tasks.fleet.buffered import BufferedRun
from tasks.prefect import fleet as ft
from tasks.prepare import Prepared

log = logging.getLogger(__name__)


@task(name="aggregate", task_run_name="aggregate version {k}", cache_policy=NO_CACHE)
def close_buffer(fleet: BufferedRun, k: int, started: float) -> dict[str, Any]:
    """Aggregate the buffer into global version ``k`` and evaluate it on the host."""
    return fleet.close_buffer(started)


def run_buffered(fleet: BufferedRun, boards: list[Board], inp: stages.Inputs, prep: Prepared) -> None:
    """Keep every board training from the newest global model until ``fleet.rounds`` aggregations
    are made; FleetError when the boards still training cannot fill the buffer."""
    spec, by_name = fleet.spec, {b.name: b for b in boards}
    flying: dict[Any, str] = {}  # future -> board
    jobs = 0

    def start(name: str) -> None:
        nonlocal jobs
        jobs += 1
        ckpt, base = fleet.version_checkpoint(), fleet.started(name)
        out = fleet.folder / "jobs" / f"{jobs:04d}-{name}"
        deadline = time.time() + spec.deadline_s  # per job: a board past it is cut and starts again
        future = ft.board_round.submit(by_name[name], inp, prep, ckpt, fleet.run_id, base + 1, deadline, out)
        flying[future] = name

    for b in boards:
        start(b.name)
    started, waiting = time.monotonic(), []
    try:
        while fleet.version < spec.rounds:
            fleet.check_progress()
            done = _first_done(list(flying), spec.deadline_s + 120)
            name = flying.pop(done)
            fleet.arrive(name, ft.outcome(done))
            waiting.append(name)
            if not fleet.full():
                continue
            try:
                close_buffer(fleet, fleet.version + 1, started)
            finally:
                ft.publish_fleet(fleet.summary())
                ft.mark_boards(fleet.summary())
            started = time.monotonic()
            if fleet.version < spec.rounds:
                for name in waiting:
                    start(name)
                waiting = []
    finally:
        stop_jobs(fleet, by_name, flying)


def _first_done(futures: list[Any], timeout: float) -> Any:
    """The first of ``futures`` (the thread pool's Prefect futures) to end; FleetError when none
    does within ``timeout`` s. (``prefect.futures.as_completed`` arms a cancel scope, a SIGALRM on
    the main thread, that stays armed while its generator is suspended: not for one item at a time.)"""
    inner = {f.wrapped_future: f for f in futures}
    done, _ = concurrent.futures.wait(inner, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
    if not done:
        raise FleetError(f"no board's job ended within {timeout:g} s")
    return inner[next(iter(done))]


def stop_jobs(
    fleet: BufferedRun, boards: dict[str, Board], flying: dict[Any, str], wait_s: float = 120
) -> None:
    """Cancel this run's jobs still training on their boards and wait (``wait_s`` at most) for
    their tasks to end; a task that had not started its job yet is caught on the next pass."""
    tag = "".join(c for c in fleet.run_id if c.isalnum())[:12]
    end = time.monotonic() + wait_s
    pending = list(flying)
    ft.STOPPING.add(fleet.run_id)
    try:
        while pending and time.monotonic() < end:
            for future in pending:
                _cancel_run_job(boards[flying[future]], tag)
            pending = list(wait(pending, timeout=2).not_done)
    finally:
        ft.STOPPING.discard(fleet.run_id)
    if pending:
        log.warning("%d board jobs still running after %.0f s: %s", len(pending), wait_s,
                    ", ".join(flying[f] for f in pending))  # fmt: skip


def _cancel_run_job(board: Board, tag: str) -> None:
    """Cancel the job training on ``board`` if it is this run's (best effort)."""
    with contextlib.suppress(Exception), job_link(board) as link:
        job = link.running_job()
        if job is not None and job.endswith(f"-{tag}"):
            link.cancel(job)
