"""``supervise JOBDIR``: what ``start`` runs detached. It runs the job (``run``) as its child,
holding the job's locks with it, and when the child dies without a result it finds out why.

A job the kernel killed for memory (its cgroup's or the system's OOM killer: SIGKILL, and an
``oom_kill`` counter went up while it ran) gets a ``failed`` result with exit OUT_OF_MEMORY,
naming its peak RSS, the job's memory estimate and the RAM the board lets it use; its last
checkpoint stays in the job folder, and neither the agent nor the host restarts it as it is
(the same job would be killed again).

A child dead of any other signal but a stop (SIGTERM, SIGINT, SIGHUP: a shutdown leaves the job
``interrupted``, to resume) gets a ``failed`` result in one line with exit CRASHED: the signal, the
step and epoch it was training and the first dataset indices of its batch, which the trainer marks
before each step (:mod:`device_agent.job.batch_mark`); a new ``start`` resumes it from its last
checkpoint. When the job's previous death (its last CRASHED ``failed`` event) was of the same signal
at the same place, the death is deterministic (ONNX Runtime dies of that batch: an integer division
by a count of positive labels that the batch leaves at 0): exit CRASHED_AGAIN, never retried.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from device_agent.atomic import atomic_write
from device_agent.job.batch_mark import BatchMark, read_mark
from device_agent.job.checkpoints import Progress, latest_checkpoint
from device_agent.job.events import EventLog, read_events
from device_agent.job.jobdir import (
    BOARD_LOCK_FD_ENV,
    LOCK_FD_ENV,
    JobDir,
    load_spec,
    open_jobdir,
    read_result,
)
from device_agent.protocol import ExitCode, JobResult, JobSpec
from device_agent.signals import death
from device_agent.sysinfo import meminfo_mb, versions

# a shutdown, not a fault: the job is left interrupted, to resume
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _cgroup_dirs() -> list[Path]:
    """This process's memory cgroup folders (v1 memory controller, v2 unified), those visible."""
    dirs = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            dirs.append(Path("/sys/fs/cgroup") / path.lstrip("/"))
            dirs.append(Path("/sys/fs/cgroup/unified") / path.lstrip("/"))
        elif "memory" in controllers.split(","):
            dirs.append(Path("/sys/fs/cgroup/memory") / path.lstrip("/"))
    return [d for d in dirs if d.is_dir()]


def oom_kills() -> dict[str, int]:
    """Every ``oom_kill`` counter this process can read: its cgroup's and the system's."""
    found = {}
    for d in _cgroup_dirs():
        for name in ("memory.events", "memory.oom_control"):
            count = _field(d / name, "oom_kill")
            if count is not None:
                found[str(d / name)] = count
    count = _field(Path("/proc/vmstat"), "oom_kill")
    if count is not None:
        found["/proc/vmstat"] = count
    return found


def _field(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == key:
                return int(parts[1])
    except (OSError, ValueError):
        return None
    return None


def _die_with_parent() -> None:
    """In the child: the kernel SIGKILLs it when the supervisor dies (a killed ``start`` child is a
    killed job, to resume), as if both were one process."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def cmd_supervise(args: argparse.Namespace) -> int:
    """Run the job as a child (started detached by ``start``); report its death by a signal."""
    job = open_jobdir(args.jobdir, args.root)
    before = oom_kills()
    argv = [sys.executable, "-m", "device_agent", "--root", str(args.root), "run", str(job.path)]
    fds = tuple(int(os.environ[k]) for k in (LOCK_FD_ENV, BOARD_LOCK_FD_ENV) if k in os.environ)
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=fds,
                             preexec_fn=_die_with_parent)  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))  # a cancel reaches the job
    _, status, usage = os.wait4(child.pid, 0)
    if os.WIFSIGNALED(status) and read_result(job) is None:
        signum, peak_mb = os.WTERMSIG(status), usage.ru_maxrss / 1024
        if signum == signal.SIGKILL and any(oom_kills().get(k, 0) > v for k, v in before.items()):
            return _out_of_memory(job, peak_mb)
        if signum not in STOP_SIGNALS:
            return _crashed(job, signum, peak_mb)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1


def _kept(job: JobDir, spec: JobSpec) -> tuple[Path | None, Progress]:
    """The job's last checkpoint and the progress it holds (none: no step kept)."""
    last = latest_checkpoint(job.checkpoints)
    if last is None:
        return None, Progress()
    from device_agent.runtimes import checkpoint_state  # numpy: only for a job that died

    return last, Progress.from_properties(
        checkpoint_state(spec.runtime).load_checkpoint(str(last)).properties
    )


def _kept_words(last: Path | None, progress: Progress) -> str:
    return (
        f"its last checkpoint (step {progress.step}) is kept in {last}"
        if last
        else "it had written no checkpoint yet"
    )


def _out_of_memory(job: JobDir, peak_mb: float) -> int:
    spec = load_spec(job)
    last, progress = _kept(job, spec)
    cap = meminfo_mb()["total_mb"]  # MemTotal, or the cgroup's limit when lower
    error = (
        f"out of memory: the kernel killed the job (peak RSS {peak_mb:.0f} MB; the job's estimate was "
        f"{spec.memory_estimate_mb:.0f} MB, the board lets it use {cap:.0f} MB); {_kept_words(last, progress)}. "
        "Running it again as it is would be killed again: lower training.batch_size, or set "
        "training.cache_dtype = 'float16' / cache_store = 'disk', or train fewer layers"
    )
    return _fail(job, spec, ExitCode.OUT_OF_MEMORY, error, Progress(step=progress.step), peak_mb,
                 memory_estimate_mb=spec.memory_estimate_mb, memory_cap_mb=cap)  # fmt: skip


KILLED = {
    "SIGKILL": "killed by another process, or by an out-of-memory killer whose counters this board does not show"
}
SHOWN_ROWS = 16  # the samples a crash's line names (the event keeps the mark's)


def _crashed(job: JobDir, signum: int, peak_mb: float) -> int:
    """The child died of ``signum``: a failed result naming the signal, the step and the batch's
    samples (``JOBDIR/batch``); CRASHED_AGAIN, never retried, when the job's previous death was of the
    same signal at the same place."""
    spec = load_spec(job)
    mark, name = read_mark(job.batch_file), death(-signum).split(" (")[0]
    previous, total = _history(job)
    again = mark is not None and mark.same_place(previous[1]) and previous[0] == name
    last, progress = _kept(job, spec)
    where = _where(mark, total)
    if again:
        error = (
            f"the training process died of {death(-signum, KILLED)} {where}, as the time before: that batch "
            "kills it every time; not retried: check those samples against what the loss needs (e.g. a division "
            f"by a count of positive labels: keep it at least 1), then train again; {_kept_words(last, progress)}"
        )
    else:
        error = (
            f"the training process died of {death(-signum, KILLED)} {where}; {_kept_words(last, progress)}: a new "
            f"start {'resumes from it' if last else 'trains it from its start'}, and a death at the same step "
            "again is not retried"
        )
    code = ExitCode.CRASHED_AGAIN if again else ExitCode.CRASHED
    return _fail(job, spec, code, error, progress, peak_mb, signal=name,
                 batch=mark.to_dict() if mark else None)  # fmt: skip


def _history(job: JobDir) -> tuple[tuple[str, BatchMark | None], int | None]:
    """The job's previous death by a signal (its signal's name and mark) and its total steps, from its events."""
    previous: tuple[str, BatchMark | None] = ("", None)
    total = None
    for event in read_events(job.events):
        data = event.get("data") or {}
        if event.get("type") == "started":
            total = data.get("total_steps")
        elif event.get("type") == "failed" and data.get("exit_code") == ExitCode.CRASHED:
            previous = (str(data.get("signal")), BatchMark.from_dict(data.get("batch") or {}))
    return previous, total


def _where(mark: BatchMark | None, total: int | None) -> str:
    """Where the process was: the step, epoch and samples of its batch."""
    if mark is None or mark.phase == "open":
        return (
            "while opening the job (loading its artifacts, checking or labelling its data), before training"
        )
    if mark.phase == "finish":
        return f"while exporting the trained model after step {mark.step}"
    if mark.phase == "eval":
        return (
            f"evaluating {mark.samples('eval_data', SHOWN_ROWS)} after step {mark.step} (epoch {mark.epoch})"
        )
    of = f" of {total}" if total else ""
    return (
        f"at step {mark.step}{of} (epoch {mark.epoch}), training on {mark.samples('train_data', SHOWN_ROWS)}"
    )


def _fail(job: JobDir, spec: JobSpec, code: ExitCode, error: str, progress: Progress, peak_mb: float,
          **data: Any) -> int:  # fmt: skip
    """Write the ``failed`` event and result of a job whose process died; returns ``code``."""
    result = JobResult(
        job_id=spec.job_id, status="failed", exit_code=int(code), steps=progress.step,
        epochs_done=progress.epoch, duration_s=0.0, train_loop_s=0.0, peak_rss_mb=round(peak_mb, 1),
        metrics={}, history=progress.history, outputs={}, error=error, versions=versions(),
    )  # fmt: skip
    events = EventLog(job.events, spec.job_id)
    try:
        events.emit("failed", step=progress.step, exit_code=int(code), error=error, cause=code.name,
                    peak_rss_mb=round(peak_mb, 1), at=time.time(), **data)  # fmt: skip
    finally:
        events.close()
    atomic_write(job.result_file, result.to_json())
    return int(code)
