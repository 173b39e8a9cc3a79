"""Every pull job a process follows, read together: :class:`JobWatch`.

A run following its pull-mode board's job (:class:`~tasks.board.pull.link.PullLink`) waits here for
the job's state or events to change. One reader thread per mailbox reads every followed job with one
query a tick (:data:`READ_S`), so a fleet round following a thousand boards' jobs makes two queries a
second, not two thousand; it also decides whose turn it is to log who the process waits for.
"""

from __future__ import annotations

import logging
import threading
import time

from tasks.board.pull.mailbox import Mailbox

log = logging.getLogger(__name__)

WAIT_LOG_S = 60.0  # how often a run waiting for its board says so
READ_S = 0.5  # how often the mailbox is read for news of the followed jobs


class JobWatch:
    """Every job this process follows in one mailbox, read with one query a tick (:data:`READ_S`):
    a fleet round follows a thousand boards' jobs with two queries a second, not two thousand. A
    follower waits on its job's own event, set only when the job's state or events changed."""

    _all: dict[str, JobWatch] = {}
    _lock = threading.Lock()

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        self.lock = threading.Lock()
        self.waiting: dict[str, list[threading.Event]] = {}  # job id -> its followers' events
        self.marks: dict[str, tuple[str, int]] = {}  # job id -> (state, events bytes), as last read
        self.reader: threading.Thread | None = None
        self.waiters: dict[str, float] = {}  # boards whose runs said they wait, and when
        self.said = -WAIT_LOG_S  # when this process last logged who it waits for

    @classmethod
    def of(cls, mailbox: Mailbox) -> JobWatch:
        """The process's watch over the mailbox ``mailbox`` is (its store, or its folder)."""
        key = mailbox.shared.cfg.url if mailbox.shared is not None else str(mailbox.root.resolve())
        with cls._lock:
            watch = cls._all.get(key)
            if watch is None:
                watch = cls._all[key] = cls(mailbox)
            return watch

    def wait(self, job_id: str, known: tuple[str, int] | None, timeout: float) -> tuple[str, int] | None:
        """The job's (state, events bytes) once it differs from ``known``, or as it is after ``timeout``
        seconds (None: not read yet)."""
        event = threading.Event()
        with self.lock:
            mark = self.marks.get(job_id)
            if mark is not None and mark != known:
                return mark
            self.waiting.setdefault(job_id, []).append(event)
            if self.reader is None:
                self.reader = threading.Thread(target=self._read, name="pull-job-watch", daemon=True)
                self.reader.start()
        event.wait(timeout)
        with self.lock:
            followers = self.waiting.get(job_id, [])
            if event in followers:
                followers.remove(event)
            if not followers:
                self.waiting.pop(job_id, None)
            return self.marks.get(job_id)

    def say_waiting(self, board: str, what: str) -> list[str] | None:
        """``board`` waits (to ``what``); the boards that said so within :data:`WAIT_LOG_S` when it is
        this caller's turn to log them (once a WAIT_LOG_S for the process), else None."""
        now = time.monotonic()
        with self.lock:
            self.waiters[board] = now
            for name in [b for b, at in self.waiters.items() if now - at > WAIT_LOG_S * 1.5]:
                del self.waiters[name]
            if now - self.said < WAIT_LOG_S:
                return None
            self.said = now
            return sorted(self.waiters)

    def _read(self) -> None:
        while True:
            with self.lock:
                ids = list(self.waiting)
                if not ids:
                    self.reader = None
                    self.marks.clear()  # nobody follows: nothing kept for jobs long over
                    return
            try:
                marks = self.mailbox.marks(ids)
            except Exception as exc:  # noqa: BLE001 - the store out of reach: its followers wait on
                log.warning("reading the mailbox's jobs failed (tried again): %s", exc)
                marks = {}
            with self.lock:
                for job_id, mark in marks.items():
                    if self.marks.get(job_id) != mark:
                        self.marks[job_id] = mark
                        for event in self.waiting.get(job_id, []):
                            event.set()
            time.sleep(READ_S)
