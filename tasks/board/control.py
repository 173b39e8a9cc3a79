"""The agent's board-level JSON commands from the host: one call (``agent_json``) and the board
dataset folder's listing (files with size, sha256 and samples)."""

from __future__ import annotations

from typing import Any

from device_agent.protocol import ExitCode
from tasks.board.agent import agent_argv, last_json_line
from tasks.board.inventory import Board
from tasks.board.transport import Transport
from tasks.errors import DataError, RemoteCommandFailed


def agent_json(conn: Transport, board: Board, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run an agent command and return its JSON answer; DataError for a data problem, else
    RemoteCommandFailed with the agent's message."""
    argv = agent_argv(board, *args)
    res = conn.run(argv, check=False, timeout=timeout)
    answer = last_json_line(res.stdout)
    if res.code == 0 and isinstance(answer, dict):
        return answer
    message = answer.get("error") if isinstance(answer, dict) else (res.stderr or res.stdout)[-500:]
    if res.code == ExitCode.DATA_MISMATCH:
        raise DataError(f"board {board.name}: {message}")
    raise RemoteCommandFailed(argv, res.code, str(message))


def list_dataset(conn: Transport, board: Board, path: str, fmt: str) -> dict[str, Any]:
    """The board dataset folder's files with size, sha256 and samples."""
    return agent_json(conn, board, "dataset", path, "--format", fmt, timeout=600)
