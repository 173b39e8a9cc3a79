"""``events.jsonl``: an append-only log of protocol Events, one fsync'd JSON line each.

``seq`` increases by one per line over the whole life of a job, across resumes: on open we read
the last complete line's seq (and cut a torn last line left by a power loss).

Every line is flushed as written (a reader following the file sees it live). Every event except
``step`` is also fsync'd; ``step`` lines are fsync'd at most once per ``STEP_FSYNC_S`` (an fsync
costs ~3 ms, more than a whole step of a small model), so a power loss can drop the last second
of progress lines, which the resumed run writes again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from device_agent.protocol import Event

TAIL_BYTES = 65536
STEP_FSYNC_S = 1.0


def read_last_event(path: Path) -> dict[str, Any] | None:
    """The last complete JSON line of an events file as a dict, or None."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            tail = fh.read()
    except FileNotFoundError:
        return None
    for line in reversed(tail.split(b"\n")):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete event of a file (readers skip torn lines)."""
    out = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _cut_torn_tail(path: Path) -> None:
    """Truncate a last line that has no newline (a write interrupted by a crash)."""
    with open(path, "rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)


class EventLog:
    """Appends Events to ``events.jsonl`` with a monotonically increasing seq."""

    def __init__(self, path: Path, job_id: str) -> None:
        self.path = Path(path)
        self.job_id = job_id
        if self.path.exists():
            _cut_torn_tail(self.path)
        last = read_last_event(self.path)
        self.next_seq = int(last["seq"]) + 1 if last and isinstance(last.get("seq"), int) else 0
        self._fh = open(self.path, "a", encoding="utf-8")
        self._synced = time.monotonic()

    def emit(self, type_: str, **data: Any) -> Event:
        """Write one event line and flush it; fsync it (``step`` lines: at most once a second)."""
        event = Event(type=type_, job_id=self.job_id, seq=self.next_seq, data=data)
        self._fh.write(event.to_json() + "\n")
        self._fh.flush()
        now = time.monotonic()
        if type_ != "step" or now - self._synced >= STEP_FSYNC_S:
            os.fsync(self._fh.fileno())
            self._synced = now
        self.next_seq += 1
        return event

    def close(self) -> None:
        """Close the file."""
        self._fh.close()
