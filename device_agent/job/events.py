"""``events.jsonl``: an append-only log of protocol Events, one fsync'd JSON line each.

``seq`` increases by one per line over the whole life of a job, across resumes: on open we read
the last complete line's seq (and cut a torn last line left by a power loss).

Every line is flushed as written (a reader following the file sees it live). Every event except
``step`` is also fsync'd; ``step`` lines are fsync'd by a background thread at most
``STEP_FSYNC_S`` after they were written (an fsync costs 1 ms to over 100 ms on a busy disk, more
than a whole step of a small model, so it stays off the training loop), so a power loss can drop
the last second of progress lines, which the resumed run writes again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from device_agent.protocol import Event

log = logging.getLogger(__name__)
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
        self._unsynced = False  # step lines written since the last fsync
        self._syncer: threading.Thread | None = None
        self._closing = threading.Event()

    def emit(self, type_: str, **data: Any) -> Event:
        """Write one event line and flush it; fsync it (``step`` lines: within a second, in the background)."""
        event = Event(type=type_, job_id=self.job_id, seq=self.next_seq, data=data)
        self._fh.write(event.to_json() + "\n")
        self._fh.flush()
        if type_ == "step":
            self._unsynced = True
            if self._syncer is None:
                self._syncer = threading.Thread(target=self._sync_steps, name="events-fsync", daemon=True)
                self._syncer.start()
        else:
            self._unsynced = False
            os.fsync(self._fh.fileno())
        self.next_seq += 1
        return event

    def _sync_steps(self) -> None:
        """The background thread: fsync step lines once per ``STEP_FSYNC_S`` while there are new ones."""
        fd = self._fh.fileno()
        while not self._closing.wait(STEP_FSYNC_S):
            if self._unsynced:
                self._unsynced = False
                try:
                    os.fsync(fd)
                except OSError as exc:  # the next non-step event's fsync raises it in the loop
                    log.warning("fsync of %s failed: %s", self.path, exc)

    def close(self) -> None:
        """Stop the background fsync, then close the file."""
        self._closing.set()
        if self._syncer is not None:
            self._syncer.join()
        self._fh.close()
