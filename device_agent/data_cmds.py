"""The agent commands that read data: ``validate``, ``run`` (the trainer and ORT) and ``dataset``
(a board dataset folder, hashed). They load numpy, which the other commands do without (``status``
is polled while a job trains): :mod:`device_agent.cli` imports this module only to run one of them.
"""

from __future__ import annotations

import argparse
import logging
import os

from device_agent.data.datasets import list_dataset
from device_agent.errors import AgentError
from device_agent.job.jobdir import (
    BOARD_LOCK_FD_ENV,
    JobDir,
    inherited_lock,
    load_spec,
    open_board_lock,
    open_jobdir,
    open_lock,
)
from device_agent.job.runner import open_job, run_job, stored_outcome
from device_agent.output import emit
from device_agent.protocol import ExitCode


def cmd_validate(args: argparse.Namespace) -> int:
    """Check spec, blobs, RAM/disk, that the artifacts load and the data fit; no training step."""
    job = open_jobdir(args.jobdir, args.root)
    spec = load_spec(job)
    opened = open_job(job, spec)
    emit({
        "ok": True, "job_id": spec.job_id, "exit_code": 0, "train_samples": len(opened.train_ds),
        "eval_samples": len(opened.eval_ds) if opened.eval_ds is not None else 0,
        "inputs": {i.name: [d if d is not None else "N" for d in i.shape] for i in opened.data_inputs},
        "num_classes": opened.num_classes, "resume_from_step": opened.progress.step if opened.resumed else None,
    })  # fmt: skip
    return ExitCode.OK


def cmd_run(args: argparse.Namespace) -> int:
    """Train in the foreground (resuming if interrupted); prints the result as one JSON line."""
    job = open_jobdir(args.jobdir, args.root)
    spec = load_spec(job)
    fd, board_fd = inherited_lock(), inherited_lock(BOARD_LOCK_FD_ENV)
    if fd is None:
        fd = open_lock(job)
        job.cancel_file.unlink(missing_ok=True)
    if board_fd is None and stored_outcome(job) is None:  # a stored result trains nothing: no board lock
        try:
            board_fd = open_board_lock(job)
        except AgentError:
            os.close(fd)
            raise
    _log_to(job)
    job.pid_file.write_text(f"{os.getpid()}\n")
    try:
        result = run_job(job, spec)
    finally:  # the board lock first: a job seen as not running has let the board go
        if board_fd is not None:
            os.close(board_fd)
        os.close(fd)
    emit(result.to_dict())
    return result.exit_code


def cmd_dataset(args: argparse.Namespace) -> int:
    """List a dataset folder's files with size, sha256 and samples (hashes cached by mtime)."""
    emit(list_dataset(args.root, args.path, args.format))
    return ExitCode.OK


def _log_to(job: JobDir) -> None:
    handler = logging.FileHandler(job.log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)


COMMANDS = {"validate": cmd_validate, "run": cmd_run, "dataset": cmd_dataset}
