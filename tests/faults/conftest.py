"""Helpers of the fault suite (the ``local_board`` fixture lives in tests/fixtures_board.py: same
agent, same root layout, no sshd). A test that must act while a job runs holds it at a step first
(the agent's hold hook, :mod:`device_agent.job.hold`): the job cannot end before the test acts,
however loaded the machine."""

from __future__ import annotations

import posixpath
import time

from device_agent.protocol import Event
from tasks.board import jobs
from tasks.board.inventory import Board
from tasks.board.transport import Transport


def board_events(conn: Transport, board: Board, job_id: str) -> list[Event]:
    """Every event of the job as the board holds it."""
    raw = conn.read_from(posixpath.join(jobs.job_dir(board, job_id), "events.jsonl"), 0).decode()
    return [Event.from_json(line) for line in raw.splitlines() if line.strip()]


def hold_job(conn: Transport, board: Board, job_id: str, at_step: int) -> None:
    """Ask the job to pause once it has trained ``at_step`` steps (``JOBDIR/hold``)."""
    hold = posixpath.join(jobs.job_dir(board, job_id), "hold")
    conn.run(["sh", "-c", 'printf %s "$1" > "$2"', "sh", str(at_step), hold])


def held_at(conn: Transport, board: Board, job_id: str) -> int:
    """The step a job started for the first time paused at (``JOBDIR/held``), once it has; fails when
    the job ended (wrote its result) without pausing."""
    held = posixpath.join(jobs.job_dir(board, job_id), "held")
    while not (text := conn.read_from(held, 0).decode().strip()):  # created, then written: read a step
        assert jobs.read_result(conn, board, job_id) is None, f"job {job_id} ended without pausing"
        time.sleep(0.05)
    return int(text)


def release_job(conn: Transport, board: Board, job_id: str) -> None:
    """Let a paused job go on, and a later run of it not pause (removes ``JOBDIR/hold``)."""
    conn.run(["rm", "-f", posixpath.join(jobs.job_dir(board, job_id), "hold")])
