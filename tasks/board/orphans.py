"""One job trains on a board at a time: the job training there now, whether it was made from the
same inputs as a new one, and settling an orphan of a killed host (reattached when it is the
same training, ended or refused when not)."""

from __future__ import annotations

import logging
import posixpath
import time

from device_agent.protocol import JobSpec
from tasks.board.control import agent_json
from tasks.board.inventory import Board
from tasks.board.jobs import job_dir
from tasks.board.transport import Transport
from tasks.errors import BoardError

log = logging.getLogger(__name__)


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
