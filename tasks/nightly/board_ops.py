"""Host side of the agent's board-level commands: the dataset folder's listing, the models in
service (install, read back, verify against the registry) and the job training now (an orphan
of a killed host is reattached or ended, never trained beside)."""

from __future__ import annotations

import logging
import posixpath
import time
from typing import Any

from device_agent.protocol import ExitCode, JobSpec
from tasks.board.agent import agent_argv, last_json_line
from tasks.board.inventory import Board
from tasks.board.transport import Transport
from tasks.errors import BoardError, DataError, RemoteCommandFailed, TransferError

log = logging.getLogger(__name__)

RELEASE_FILES = ("model.onnx", "model.int8.onnx", "priors.npy")


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


def install_version(conn: Transport, board: Board, recipe: str, version: Any) -> dict[str, Any]:
    """Upload a version's files as blobs, install them as the board's current release and read
    it back: every file's sha256 on the board must equal the registry's."""
    from tasks.board.blobs import upload_blobs

    files = version.verified_files(RELEASE_FILES)  # name -> (path, sha256 as recorded)
    hashes = {name: sha for name, (_, sha) in files.items()}
    upload_blobs(conn, board, {sha: path for path, sha in files.values()})
    args = [f"{name}={sha}" for name, sha in hashes.items()]
    answer = agent_json(conn, board, "install-model", recipe, version.name, *args)
    current = answer.get("current") or {}
    if (
        current.get("version") != version.name
        or current.get("files") != hashes
        or not current.get("verified")
    ):
        raise TransferError(
            f"board {board.name}: models/{recipe}/current is {current.get('version')!r} with files "
            f"{current.get('files')} after installing {version.name} {hashes}"
        )
    hook = answer.get("hook")
    if hook and hook.get("exit_code") != 0:
        log.warning("board %s: models/%s/on-change failed: %s", board.name, recipe, hook)
    return answer


def board_models(conn: Transport, board: Board, recipe: str) -> dict[str, Any]:
    """The releases the board serves for ``recipe`` (current and previous)."""
    return agent_json(conn, board, "models", recipe)


def running_job(conn: Transport, board: Board) -> str | None:
    """The id of the job training on the board now, if any."""
    answer = agent_json(conn, board, "jobs", "--running")
    running = [j for j in answer.get("jobs", []) if j.get("state") == "running"]
    return running[0]["job_id"] if running else None


def same_job(conn: Transport, board: Board, other: str, spec: JobSpec) -> bool:
    """Whether job ``other`` on the board was made from the same inputs as ``spec``."""
    raw = conn.read_from(posixpath.join(board.root, "jobs", other, "job.json"), 0).decode()
    if not raw:
        return False
    theirs = JobSpec.from_json(raw).to_dict()
    ours = spec.to_dict()
    theirs.pop("job_id", None)
    ours.pop("job_id", None)
    return theirs == ours


def settle_orphan(conn: Transport, board: Board, spec: JobSpec, *, end: bool, wait_s: float = 300) -> str:
    """Make the board free for ``spec``: the job id to follow (``spec``'s, or an orphan made
    from the same inputs, which is reattached rather than trained twice).

    An orphan from other inputs is cancelled (it stops at the next step and checkpoints) when
    ``end`` (the caller holds the board's concurrency slot, so no live run owns that job); else
    BoardError says which job trains there.
    """
    from tasks.board.jobs import job_dir

    other = running_job(conn, board)
    if other is None or other == spec.job_id:
        return spec.job_id
    if same_job(conn, board, other, spec):
        log.warning("board %s: job %s from the same inputs is training (its run was cut off): "
                    "reattaching to it instead of starting %s", board.name, other, spec.job_id)  # fmt: skip
        return other
    if not end:
        raise BoardError(
            f"board {board.name}: job {other} is training; wait for it or cancel it "
            f"(python3 -m device_agent cancel {job_dir(board, other)})"
        )
    log.warning("board %s: ending orphaned job %s (no run holds the board) before %s",
                board.name, other, spec.job_id)  # fmt: skip
    agent_json(conn, board, "cancel", job_dir(board, other))
    deadline = time.monotonic() + wait_s
    while running_job(conn, board) == other:
        if time.monotonic() > deadline:
            raise BoardError(f"board {board.name}: job {other} did not stop within {wait_s:.0f} s of cancel")
        time.sleep(0.5)
    return spec.job_id
