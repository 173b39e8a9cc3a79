"""A job's state as ``status`` and ``jobs`` report it: read from its folder, its lock and its events."""

from __future__ import annotations

from typing import Any

from device_agent.job.events import read_events, read_last_event
from device_agent.job.jobdir import JobDir, lock_is_held, read_result


def job_status(job: JobDir) -> dict[str, Any]:
    """The ``status`` answer: state, pid, step, epoch, total_steps, events_bytes, last event."""
    result = read_result(job)
    running = lock_is_held(job)
    last = read_last_event(job.events)
    if running:
        state = "running"
    elif result is not None:
        state = result.status
    elif last is not None or (job.checkpoints.is_dir() and any(job.checkpoints.iterdir())):
        state = "interrupted"
    else:
        state = "pending"
    return {
        "job_id": job.path.name, "state": state, "pid": read_pid(job) if running else None,
        "exit_code": result.exit_code if result and not running else None,
        "events_bytes": job.events.stat().st_size if job.events.exists() else 0,
        "last_event": last, **_progress_fields(job),
    }  # fmt: skip


def read_pid(job: JobDir) -> int | None:
    """The pid in ``agent.pid`` (the process that trains the job, or supervises it), None if unreadable."""
    try:
        return int(job.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _progress_fields(job: JobDir) -> dict[str, Any]:
    """step/epoch/total_steps from the events (a full read: events files stay small)."""
    out: dict[str, Any] = {"step": 0, "epoch": 0, "total_steps": None}
    for ev in read_events(job.events):
        data = ev.get("data") or {}
        if ev.get("type") == "started":
            out["total_steps"] = data.get("total_steps")
        if isinstance(data.get("step"), int | float):
            out["step"] = int(data["step"])
        if ev.get("type") in ("epoch", "checkpoint", "step") and isinstance(data.get("epoch"), int | float):
            out["epoch"] = int(data["epoch"])
    return out
