"""``supervise JOBDIR``: what ``start`` runs detached. It runs the job (``run``) as its child,
holding the job's locks with it, and when the child dies without a result it finds out why.

A job the kernel killed for memory (its cgroup's or the system's OOM killer: SIGKILL, and an
``oom_kill`` counter went up while it ran) gets a ``failed`` result with exit OUT_OF_MEMORY,
naming its peak RSS, the job's memory estimate and the RAM the board lets it use; its last
checkpoint stays in the job folder, and neither the agent nor the host restarts it as it is
(the same job would be killed again). Any other death leaves the job ``interrupted``, to resume.
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

from device_agent.atomic import atomic_write
from device_agent.job.checkpoints import Progress, latest_checkpoint
from device_agent.job.events import EventLog
from device_agent.job.jobdir import (
    BOARD_LOCK_FD_ENV,
    LOCK_FD_ENV,
    JobDir,
    load_spec,
    open_jobdir,
    read_result,
)
from device_agent.protocol import ExitCode, JobResult
from device_agent.sysinfo import meminfo_mb, versions


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
    """Run the job as a child (started detached by ``start``); report an out-of-memory kill."""
    job = open_jobdir(args.jobdir, args.root)
    before = oom_kills()
    argv = [sys.executable, "-m", "device_agent", "--root", str(args.root), "run", str(job.path)]
    fds = tuple(int(os.environ[k]) for k in (LOCK_FD_ENV, BOARD_LOCK_FD_ENV) if k in os.environ)
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=fds,
                             preexec_fn=_die_with_parent)  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))  # a cancel reaches the job
    _, status, usage = os.wait4(child.pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL and read_result(job) is None:
        after = oom_kills()
        if any(after.get(k, 0) > v for k, v in before.items()):
            _out_of_memory(job, usage.ru_maxrss / 1024)
            return int(ExitCode.OUT_OF_MEMORY)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1


def _out_of_memory(job: JobDir, peak_mb: float) -> None:
    spec = load_spec(job)
    last = latest_checkpoint(job.checkpoints)
    step = 0
    if last is not None:
        from device_agent.runtimes import checkpoint_state  # numpy: only for a job the kernel killed

        state = checkpoint_state(spec.runtime).load_checkpoint(str(last))
        step = Progress.from_properties(state.properties).step
    cap = meminfo_mb()["total_mb"]  # MemTotal, or the cgroup's limit when lower
    kept = (
        f"its last checkpoint (step {step}) is kept in {last}" if last else "it had written no checkpoint yet"
    )
    error = (
        f"out of memory: the kernel killed the job (peak RSS {peak_mb:.0f} MB; the job's estimate was "
        f"{spec.memory_estimate_mb:.0f} MB, the board lets it use {cap:.0f} MB); {kept}. Running it again "
        "as it is would be killed again: lower training.batch_size, or set training.cache_dtype = "
        "'float16' / cache_store = 'disk', or train fewer layers"
    )
    result = JobResult(
        job_id=spec.job_id, status="failed", exit_code=int(ExitCode.OUT_OF_MEMORY), steps=step,
        epochs_done=0, duration_s=0.0, train_loop_s=0.0, peak_rss_mb=round(peak_mb, 1), metrics={},
        history=[], outputs={}, error=error, versions=versions(),
    )  # fmt: skip
    events = EventLog(job.events, spec.job_id)
    try:
        events.emit("failed", step=step, exit_code=int(ExitCode.OUT_OF_MEMORY), error=error,
                    peak_rss_mb=round(peak_mb, 1), memory_estimate_mb=spec.memory_estimate_mb,
                    memory_cap_mb=cap, at=time.time())  # fmt: skip
    finally:
        events.close()
    atomic_write(job.result_file, result.to_json())
