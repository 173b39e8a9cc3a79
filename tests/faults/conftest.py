"""Helpers of the fault suite (the ``local_board`` fixture lives in tests/fixtures_board.py: same
agent, same root layout, no sshd)."""

from __future__ import annotations

import posixpath

from device_agent.protocol import Event
from tasks.board import jobs
from tasks.board.inventory import Board
from tasks.board.transport import Transport


def board_events(conn: Transport, board: Board, job_id: str) -> list[Event]:
    """Every event of the job as the board holds it."""
    raw = conn.read_from(posixpath.join(jobs.job_dir(board, job_id), "events.jsonl"), 0).decode()
    return [Event.from_json(line) for line in raw.splitlines() if line.strip()]
