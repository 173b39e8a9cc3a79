"""Following a job on the board: ``events.jsonl`` read from a byte offset, each event delivered
once (by ``seq``), reconnecting with backoff when the link drops, resuming a job that stopped
without a result or whose process died of a signal for the first time there (agent exit CRASHED; a
second death at the same step is CRASHED_AGAIN, never retried), at most ``MAX_RESUMES`` times."""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass

from device_agent.protocol import Event, ExitCode, JobResult, SpecError
from tasks.board.inventory import Board
from tasks.board.jobs import job_dir, job_status, read_result, start_job
from tasks.board.transport import Transport, connect
from tasks.errors import DeviceError, DeviceUnreachable, Straggler, TrainingFailed, should_retry

log = logging.getLogger(__name__)

TERMINAL = ("finished", "failed", "cancelled")
MAX_RESUMES = 3  # restarts of one job by its follower
EventCallback = Callable[[Event], None]


@dataclass
class FollowStats:
    """What following one job took, filled in while it runs: new connections after a dropped link
    (``reconnects``) and restarts of a job that had stopped without a result or died of a signal
    (``resumes``)."""

    reconnects: int = 0
    resumes: int = 0


def follow_job(
    conn: Transport,
    board: Board,
    job_id: str,
    offset: int = 0,
    on_event: EventCallback | None = None,
    *,
    poll_s: float = 0.25,
    max_outage_s: float = 300.0,
    deadline: float | None = None,
    stats: FollowStats | None = None,
) -> JobResult:
    """Follow ``events.jsonl`` from ``offset`` until the job ends; reconnects on a dropped link.

    Each event (by ``seq``) is delivered once. A failure the retry policy calls retryable
    (:func:`tasks.errors.should_retry`: link down, transfer) is retried on a new connection with
    backoff; past ``max_outage_s`` of such failures in a row it raises DeviceUnreachable. Returns
    the JobResult; raises TrainingFailed for a failed or cancelled job (never retried).
    ``deadline`` (a ``time.monotonic()`` instant, a fleet round's) raises Straggler once passed,
    whether the job is slow or the board unreachable; the job is left to its owner to cancel.
    ``stats`` (updated as it happens) counts the reconnects and resumes.
    """
    stats = stats if stats is not None else FollowStats()
    follower = _Follower(board, job_id, offset, on_event, stats)
    link, owned = conn, False
    outage = _Outage(board, max_outage_s, deadline)
    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise Straggler(f"board {board.name}: job {job_id} had not finished at the round's deadline")
            try:
                result = follower.poll(link)
            except DeviceError as exc:
                if not should_retry(exc):
                    raise
                link, owned = _reconnect(board, link, owned, exc, outage), True
                stats.reconnects += 1
                continue
            outage.over()
            if result is not None:
                return _final(result)
            time.sleep(poll_s)
    finally:
        if owned:
            link.close()


class _Follower:
    """Reads new complete lines of ``events.jsonl`` and delivers unseen events in order."""

    def __init__(
        self, board: Board, job_id: str, offset: int, on_event: EventCallback | None, stats: FollowStats
    ) -> None:
        self.board, self.job_id, self.offset, self.on_event = board, job_id, offset, on_event
        self.stats = stats
        jdir = job_dir(board, job_id)
        self.events_path = posixpath.join(jdir, "events.jsonl")
        self.last_seq = -1
        self.ended = False
        self.idle_polls = 0

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
            elif result is not None and result.exit_code == ExitCode.CRASHED:  # a first death there
                self._restart(conn, f"died (exit {result.exit_code}): {result.error}")
                return None
            return result
        return None

    def _revive(self, conn: Transport) -> None:
        """The job shows no progress: resume it when the agent is not running it (reboot, power cut)."""
        state = job_status(conn, self.board, self.job_id).get("state")
        if state in ("interrupted", "pending"):
            self._restart(
                conn,
                f"stopped without a result, so with no agent exit code (state {state}: its process ended "
                "with its supervisor: a reboot, a power cut or a kill; see agent.log in the job's folder)",
            )

    def _restart(self, conn: Transport, why: str) -> None:
        """Start the job again (from its last checkpoint), or TrainingFailed past ``MAX_RESUMES``."""
        if self.stats.resumes >= MAX_RESUMES:
            raise TrainingFailed(
                f"job {self.job_id} stopped {self.stats.resumes + 1} times without finishing; the last time it {why}"
            )
        self.stats.resumes += 1
        log.warning("job %s on board %s %s: resuming it", self.job_id, self.board.name, why)
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


class _Outage:
    """Retryable failures in a row: the wait before each new try (0, 1, 2, 4 ... 10 s) and the limit."""

    def __init__(self, board: Board, max_s: float, deadline: float | None = None) -> None:
        self.board, self.max_s, self.deadline = board, max_s, deadline
        self.since: float | None = None
        self.delay = 0.0

    def wait(self, exc: Exception) -> None:
        """Sleep before the next try; DeviceUnreachable once the failures span ``max_s``."""
        now = time.monotonic()
        if self.since is None:
            self.since, self.delay = now, 0.0
        if now + self.delay - self.since > self.max_s:
            raise DeviceUnreachable(
                f"board {self.board.name}: unreachable for {self.max_s:.0f} s: {exc}"
            ) from exc
        if self.deadline is not None and now + self.delay > self.deadline:
            raise Straggler(f"board {self.board.name}: unreachable at the round's deadline: {exc}") from exc
        time.sleep(self.delay)
        self.delay = min(max(2 * self.delay, 1.0), 10.0)

    def over(self) -> None:
        """A try succeeded: the next failure starts a new outage."""
        self.since = None


def _reconnect(board: Board, link: Transport, owned: bool, exc: Exception, outage: _Outage) -> Transport:
    log.warning("board %s: %s; reconnecting", board.name, exc)
    if owned:
        link.close()
    while True:
        outage.wait(exc)
        try:
            link = connect(board)
            log.info("board %s: reconnected", board.name)
            return link
        except DeviceUnreachable as again:
            exc = again


def _final(result: JobResult) -> JobResult:
    if result.status != "finished":
        raise TrainingFailed(f"job {result.job_id} {result.status} (exit {result.exit_code}): {result.error}")
    return result
