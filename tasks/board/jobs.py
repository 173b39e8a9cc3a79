"""Jobs on a board under ``ROOT/jobs/<job_id>/``: safe job folders, ``job.json`` written atomically
and idempotently, the agent started detached, its ``status`` and ``result.json`` read back."""

from __future__ import annotations

import posixpath
import secrets
from typing import Any

from device_agent.protocol import ExitCode, JobResult, JobSpec, SpecError, valid_job_id
from tasks.board.agent import agent_argv, last_json_line
from tasks.board.inventory import Board
from tasks.board.transport import Transport
from tasks.errors import InvalidJob, RemoteCommandFailed, agent_exit_retryable


def job_dir(board: Board, job_id: str) -> str:
    """``ROOT/jobs/<job_id>`` after validating the id (no separators, no '..', no metacharacters)."""
    try:
        valid_job_id(job_id)
    except SpecError as exc:
        raise InvalidJob(f"job id {job_id!r} refused: {exc}") from exc
    path = posixpath.normpath(posixpath.join(board.root, "jobs", job_id))
    if posixpath.dirname(path) != posixpath.join(posixpath.normpath(board.root), "jobs"):
        raise InvalidJob(f"job id {job_id!r} would leave {board.root}/jobs")
    return path


def create_job(conn: Transport, board: Board, spec: JobSpec) -> str:
    """Write ``job.json`` atomically; idempotent when the same spec is already there."""
    jdir = job_dir(board, spec.job_id)
    text = spec.to_json()
    existing = conn.read_from(posixpath.join(jdir, "job.json"), 0).decode()
    if existing:
        if JobSpec.from_json(existing).to_dict() != spec.to_dict():
            raise InvalidJob(f"job {spec.job_id} already exists on board {board.name} with a different spec")
        return jdir
    conn.run(["mkdir", "-p", jdir])
    tmp = posixpath.join(jdir, f".job.json.{secrets.token_hex(4)}")
    conn.run(
        ["sh", "-c", 'cat > "$1" && mv "$1" "$2"', "sh", tmp, posixpath.join(jdir, "job.json")],
        input=text.encode(),
    )
    return jdir


def start_job(conn: Transport, board: Board, job_id: str) -> str:
    """Start the job detached on the board; 'started' or 'running' (BUSY: already running)."""
    jdir = job_dir(board, job_id)
    res = conn.run(agent_argv(board, "start", jdir), check=False, timeout=60)
    if res.code == ExitCode.BUSY:
        return "running"
    if res.code != 0:
        raise RemoteCommandFailed(agent_argv(board, "start", jdir), res.code, res.stderr or res.stdout)
    return "started"


def read_result(conn: Transport, board: Board, job_id: str) -> JobResult | None:
    """The job's ``result.json`` if the job has ended, else None."""
    raw = conn.read_from(posixpath.join(job_dir(board, job_id), "result.json"), 0)
    return JobResult.from_json(raw.decode()) if raw else None


def resumable(result: JobResult | None) -> bool:
    """True when the job must (re)start: no result yet, cancelled, or failed for a retryable cause."""
    if result is None:
        return True
    return result.status != "finished" and agent_exit_retryable(result.exit_code)


def job_status(conn: Transport, board: Board, job_id: str) -> dict[str, Any]:
    """The agent's ``status`` answer for the job (state: pending/running/interrupted/finished/...)."""
    res = conn.run(agent_argv(board, "status", job_dir(board, job_id)), check=False, timeout=60)
    answer = last_json_line(res.stdout)
    if isinstance(answer, dict):
        return answer
    return {"state": "unknown", "exit_code": res.code, "error": (res.stderr or res.stdout)[-500:]}
