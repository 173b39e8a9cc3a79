"""What pull mode's mailbox is made of: its tables, its records and its refusal, and the one
transaction every part of it runs in (:class:`Store`). :mod:`tasks.board.pull.mailbox` says how
the parts fit."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import BoardError
from tasks.paths import odl_home

OPEN = ("pending", "offered", "running", "stopping")
FINAL = ("finished", "failed", "cancelled", "expired")
BOARD_STATES = ("invited", "pending", "accepted", "revoked")
CODE_TTL_S = 24 * 3600  # a one-time enrolment code lapses after a day
NONCE_KEEP_S = 900  # nonces are remembered longer than the clock skew a request may have

SCHEMA = """
CREATE TABLE IF NOT EXISTS boards (
    name TEXT PRIMARY KEY, state TEXT NOT NULL, public_key TEXT, code_hash TEXT, code_expires REAL,
    since REAL NOT NULL, last_seen REAL, info TEXT);
CREATE TABLE IF NOT EXISTS nonces (board TEXT NOT NULL, nonce TEXT NOT NULL, ts REAL NOT NULL,
    PRIMARY KEY (board, nonce));
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, board TEXT NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL,
    item TEXT NOT NULL, created REAL NOT NULL, deadline REAL NOT NULL, offered REAL, ended REAL,
    events_len INTEGER NOT NULL DEFAULT 0, result TEXT, verdict TEXT);
CREATE INDEX IF NOT EXISTS jobs_board ON jobs (board, state);
CREATE TABLE IF NOT EXISTS events (job_id TEXT NOT NULL, offset INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (job_id, offset));
CREATE TABLE IF NOT EXISTS job_blobs (job_id TEXT NOT NULL, sha TEXT NOT NULL, PRIMARY KEY (job_id, sha));
CREATE TABLE IF NOT EXISTS uploads (job_id TEXT NOT NULL, sha TEXT NOT NULL, size INTEGER NOT NULL,
    have INTEGER NOT NULL DEFAULT 0, complete INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, sha));
"""


class Refused(BoardError):
    """A board's request the mailbox does not accept: ``status`` is the HTTP answer it gets."""

    def __init__(self, status: int, line: str, **extra: Any) -> None:
        super().__init__(line)
        self.status = status
        self.extra = extra


@dataclass(frozen=True)
class BoardRecord:
    """A pull-mode board as the host knows it."""

    name: str
    state: str
    public_key: str | None
    since: float
    last_seen: float | None
    info: dict[str, Any] | None


@dataclass(frozen=True)
class JobRecord:
    """A job (or another work item) handed to a pull-mode board, with its state."""

    id: str
    board: str
    kind: str
    state: str
    item: dict[str, Any]
    created: float
    deadline: float
    offered: float | None
    ended: float | None
    events_len: int
    result: dict[str, Any] | None
    verdict: str | None

    @property
    def final(self) -> bool:
        """True when the job has reached a final state."""
        return self.state in FINAL


def pull_home() -> Path:
    """``$ODL_HOME/pull``: the mailbox, the blobs boards fetch and send, the endpoint's TLS files."""
    return odl_home() / "pull"


class Store:
    """The mailbox's folder and database; every method of its parts is one :meth:`tx`."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else pull_home()
        self.blobs = self.root / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.db = self.root / "mailbox.sqlite3"
        db = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
            db.executescript(SCHEMA)
        finally:
            db.close()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction (``BEGIN IMMEDIATE``: writers queue, 30 s at most), committed on success."""
        db = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()


JOB_COLUMNS = "id, board, kind, state, item, created, deadline, offered, ended, events_len, result, verdict"


def job_from_row(row: tuple[Any, ...]) -> JobRecord:
    item = json.loads(row[4])
    result = json.loads(row[10]) if row[10] else None
    return JobRecord(*row[:4], item, *row[5:10], result, row[11])


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()
