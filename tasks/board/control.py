"""The agent's board-level JSON commands from the host: one call (``agent_json``), the board
dataset folder's listing (files with size, sha256 and samples) and appending files to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from device_agent.protocol import NAME, ExitCode
from tasks.board.agent import agent_argv, install_agent, last_json_line
from tasks.board.inventory import Board
from tasks.board.transport import Transport, connect
from tasks.errors import DataError, RemoteCommandFailed


def agent_json(
    conn: Transport, board: Board, *args: str, timeout: float = 120, data: bytes | None = None
) -> dict[str, Any]:
    """Run an agent command (``data`` on its stdin) and return its JSON answer; DataError for a data
    problem, else RemoteCommandFailed with the agent's message."""
    argv = agent_argv(board, *args)
    res = conn.run(argv, input=data, check=False, timeout=timeout)
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


def push_files(
    board: Board, folder: str, files: list[Path], folder_field: str = "folder"
) -> Iterator[dict[str, Any]]:
    """Append host ``files`` to the board dataset folder ``ROOT/<folder>`` through the agent's
    ``add-file`` (hidden name, then linked; a file already there is never rewritten), yielding the
    agent's answer per file (``added`` false: the same bytes were there). The folder (a relative
    path of names, ``folder_field`` in a refusal) and every file name are checked before the board
    is reached."""
    NAME.check_path(folder, folder_field, error=DataError)
    for path in files:
        NAME.check(path.name, "file name", error=DataError)
        if not path.is_file():
            raise DataError(f"{path}: no such file on the host")
    with connect(board) as conn:
        install_agent(conn, board)
        for path in files:
            yield agent_json(conn, board, "add-file", folder, path.name, data=path.read_bytes())
