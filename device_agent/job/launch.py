"""Start a job detached and ask it to stop: what the ``start`` and ``cancel`` commands do, as
functions that return their answer, so the pull-mode service (:mod:`device_agent.pull.service`)
starts and cancels a job exactly as a host does over SSH.

``start`` runs ``supervise`` (which runs ``run``) in a new session with stdio redirected and
returns at once; the job's lock and the board's training lock are taken here and handed to the
child, so two starts never race (BUSY, BOARD_BUSY).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from device_agent.errors import AgentError
from device_agent.job.jobdir import (
    BOARD_LOCK_FD_ENV,
    LOCK_FD_ENV,
    JobDir,
    load_spec,
    lock_is_held,
    open_board_lock,
    open_lock,
    read_result,
)
from device_agent.job.jobstate import job_status, read_pid
from device_agent.protocol import NEVER_RETRY

PACKAGE_PARENT = Path(__file__).resolve().parent.parent.parent


def start_job(job: JobDir) -> dict[str, Any]:
    """Start the job detached; a finished job is not started again. Raises BUSY, BOARD_BUSY."""
    spec = load_spec(job)
    done = read_result(job)
    if done is not None and done.status == "finished":
        return {"job_id": spec.job_id, "pid": None, "state": "finished"}
    fd = open_lock(job)  # BUSY if running; handed to the child so there is no race
    try:
        board_fd = open_board_lock(job)  # BOARD_BUSY while another job trains
    except AgentError:
        os.close(fd)
        raise
    job.cancel_file.unlink(missing_ok=True)
    if done is not None and not (done.status == "failed" and done.exit_code in NEVER_RETRY):
        job.result_file.unlink(missing_ok=True)  # the run being resumed replaces this stale outcome
    env = dict(
        os.environ, **{LOCK_FD_ENV: str(fd), BOARD_LOCK_FD_ENV: str(board_fd), "PYTHONPATH": _pythonpath()}
    )
    argv = [sys.executable, "-m", "device_agent", "--root", str(job.root), "supervise", str(job.path)]
    with open(os.devnull, "rb") as devnull, open(job.path / "agent.stderr", "ab") as err:
        child = subprocess.Popen(argv, stdin=devnull, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                 pass_fds=(fd, board_fd), start_new_session=True, cwd=str(job.path))  # fmt: skip
    os.close(fd)
    os.close(board_fd)
    job.pid_file.write_text(f"{child.pid}\n")
    return {"job_id": spec.job_id, "pid": child.pid, "state": "running"}


def _pythonpath() -> str:
    rest = os.environ.get("PYTHONPATH", "")
    return f"{PACKAGE_PARENT}{os.pathsep}{rest}" if rest else str(PACKAGE_PARENT)


def cancel_job(job: JobDir) -> dict[str, Any]:
    """Ask a running job to stop at its next step boundary (it saves a checkpoint)."""
    if not lock_is_held(job):
        return {"job_id": job.path.name, "state": job_status(job)["state"], "cancel": "not running"}
    job.cancel_file.write_text("cancel\n")
    return {"job_id": job.path.name, "state": "cancelling", "pid": read_pid(job)}
