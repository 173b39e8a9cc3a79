"""Fixtures of the fault suite: a board driven through LocalTransport (same agent, same root layout,
no sshd) for the fast cases, and helpers shared by the virtual-board cases."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pytest

from device_agent.protocol import Event
from tasks.board import agent, jobs
from tasks.board.inventory import Board
from tasks.board.transport import LocalTransport, Transport


@pytest.fixture
def local_board(board_python: Path, tmp_path: Path) -> Board:
    """A board whose root is a tmp folder on this machine, with the agent installed as on a board."""
    board = Board(
        name="local", host="127.0.0.1", user="nobody", key=tmp_path / "no-key",
        root=str(tmp_path / "odl"), python=str(board_python),
    )  # fmt: skip
    agent.install_agent(LocalTransport(), board)
    return board


def board_events(conn: Transport, board: Board, job_id: str) -> list[Event]:
    """Every event of the job as the board holds it."""
    raw = conn.read_from(posixpath.join(jobs.job_dir(board, job_id), "events.jsonl"), 0).decode()
    return [Event.from_json(line) for line in raw.splitlines() if line.strip()]
