"""Following a job on the board: ``events.jsonl`` read from a byte offset, each event delivered
once (by ``seq``), reconnecting with backoff when the link drops, resuming a job that stopped."""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable

from device_agent.protocol import Event, JobResult, SpecError
from tasks.board.inventory import Board
from tasks.board.jobs import job_dir, job_status, read_result, start_job
from tasks.board.transport import Transport, connect
from tasks.errors import DeviceUnreachable, TrainingFailed

log = logging.getLogger(__name__)

TERMINAL = ("finished", "failed", "cancelled")
EventCallback = Callable[[Event], None]


def follow_job(
    conn: Transport,
    board: Board,
    job_id: str,
    offset: int = 0,
    on_event: EventCallback | None = None,
    *,
    poll_s: float = 0.25,
    max_outage_s: float = 300.0,
) -> JobResult:
    """Follow ``events.jsonl`` from ``offset`` until the job ends; reconnects on a dropped link.

    Each event (by ``seq``) is delivered once. Returns the JobResult; raises TrainingFailed for a
    failed or cancelled job (never retried) and DeviceUnreachable after ``max_outage_s`` offline.
    """
    follower = _Follower(board, job_id, offset, on_event)
    link, owned = conn, False
    try:
        while True:
            try:
                result = follower.poll(link)
            except DeviceUnreachable as exc:
                link, owned = _reconnect(board, link, owned, exc, max_outage_s), True
                continue
            if result is not None:
                return _final(result)
            time.sleep(poll_s)
    finally:
        if owned:
            link.close()


class _Follower:
    """Reads new complete lines of ``events.jsonl`` and delivers unseen events in order."""

    def __init__(self, board: Board, job_id: str, offset: int, on_event: EventCallback | None) -> None:
        self.board, self.job_id, self.offset, self.on_event = board, job_id, offset, on_event
        jdir = job_dir(board, job_id)
        self.events_path = posixpath.join(jdir, "events.jsonl")
        self.last_seq = -1
        self.ended = False
        self.idle_polls = 0
        self.restarts = 0

    def poll(self, conn: Transport) -> JobResult | None:
        """One round: deliver new events; the JobResult once the job has ended."""
        data = conn.read_from(self.events_path, self.offset)
        end = data.rfind(b"\n") + 1
        for line in data[:end].decode(errors="replace").splitlines():
            self._deliver(line)
        self.offset += end
        self.idle_polls = 0 if end else self.idle_polls + 1
        if self.ended or self.idle_polls % 40 == 39:  # ~10 s without news: check the job
            result = read_result(conn, self.board, self.job_id)
            if result is None and not self.ended:
                self._revive(conn)
            return result
        return None

    def _revive(self, conn: Transport) -> None:
        """The job shows no progress: resume it when the agent is not running it (crash, reboot)."""
        state = job_status(conn, self.board, self.job_id).get("state")
        if state in ("interrupted", "pending"):
            if self.restarts >= 3:
                raise TrainingFailed(f"job {self.job_id} stopped without a result {self.restarts} times")
            self.restarts += 1
            log.warning("job %s is %s on board %s: resuming it", self.job_id, state, self.board.name)
            start_job(conn, self.board, self.job_id)

    def _deliver(self, line: str) -> None:
        if not line.strip():
            return
        try:
            event = Event.from_json(line)
        except SpecError as exc:
            log.warning("job %s: unreadable event line skipped (%s)", self.job_id, exc)
            return
        if event.seq <= self.last_seq:
            return
        self.last_seq = event.seq
        if event.type == "started":  # a resumed run: an earlier terminal line no longer ends the job
            self.ended = False
        self.ended = self.ended or event.type in TERMINAL
        if self.on_event:
            self.on_event(event)


def _reconnect(board: Board, link: Transport, owned: bool, exc: Exception, max_outage_s: float) -> Transport:
    log.warning("board %s: %s; reconnecting", board.name, exc)
    if owned:
        link.close()
    deadline, delay = time.monotonic() + max_outage_s, 1.0
    while True:
        try:
            link = connect(board)
            log.info("board %s: reconnected", board.name)
            return link
        except DeviceUnreachable as again:
            if time.monotonic() + delay > deadline:
                raise DeviceUnreachable(
                    f"board {board.name}: unreachable for {max_outage_s:.0f} s: {again}"
                ) from again
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def _final(result: JobResult) -> JobResult:
    if result.status != "finished":
        raise TrainingFailed(f"job {result.job_id} {result.status} (exit {result.exit_code}): {result.error}")
    return result
