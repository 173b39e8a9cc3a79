"""What pull mode's mailbox is made of: its tables, its records and its refusal, and the one
transaction every part of it runs in (:class:`Store`), on either backend.

Without a shared store the tables are SQLite's (``$ODL_HOME/pull/mailbox.sqlite3``); with one
(``ODL_STORE_URL``: :func:`tasks.store.configured_store`) they are PostgreSQL's, named
``odl_pull_<table>``, so the runs of every host and the one endpoint share them. Each query is
written once, in SQLite's spelling, and :class:`Dialect` turns it into PostgreSQL's: ``%s`` for
``?``, the tables' prefix, and in :data:`SCHEMA` ``DOUBLE PRECISION`` for ``REAL`` and ``BYTEA``
for ``BLOB``. The rest is spelled the same on both (``ON CONFLICT ... DO UPDATE`` and
``excluded``, ``length()`` of a blob in bytes, ``"offset"`` quoted). Both serialize transactions:
SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's advisory lock :data:`MAILBOX_LOCK` held by each one,
so a check-then-write (an enrolment, a submission) sees the write before it on every host.

The tables are created on first use, like the store's own (:mod:`tasks.store.connection`:
``CREATE ... IF NOT EXISTS`` under its advisory lock, as two hosts may start at once), from this
module's :data:`SCHEMA`: one text for both backends, next to the queries that read it.
:mod:`tasks.board.pull.mailbox` says how the parts fit."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.paths import odl_home
from tasks.store import PgBlobStore, configured_store
from tasks.store import Store as SharedStore
from tasks.store.connection import SCHEMA_LOCK

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
CREATE INDEX IF NOT EXISTS nonces_ts ON nonces (ts);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, board TEXT NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL,
    item TEXT NOT NULL, created REAL NOT NULL, deadline REAL NOT NULL, offered REAL, ended REAL,
    events_len INTEGER NOT NULL DEFAULT 0, result TEXT, verdict TEXT);
CREATE INDEX IF NOT EXISTS jobs_board ON jobs (board, state);
CREATE INDEX IF NOT EXISTS jobs_open ON jobs (state, deadline);
CREATE TABLE IF NOT EXISTS events (job_id TEXT NOT NULL, "offset" INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (job_id, "offset"));
CREATE TABLE IF NOT EXISTS job_blobs (job_id TEXT NOT NULL, sha TEXT NOT NULL, PRIMARY KEY (job_id, sha));
CREATE TABLE IF NOT EXISTS uploads (job_id TEXT NOT NULL, sha TEXT NOT NULL, size BIGINT NOT NULL,
    have BIGINT NOT NULL DEFAULT 0, complete INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, sha));
"""
MAILBOX_LOCK = 0x0D1_9011  # pg_advisory_xact_lock key each shared mailbox transaction holds
TABLE = re.compile(
    r"\b(FROM|INTO|UPDATE|JOIN|EXISTS|ON)(\s+)(boards|nonces_ts|nonces|jobs_board|jobs_open|jobs|events|job_blobs|uploads)\b"
)


@dataclass(frozen=True)
class Dialect:
    """How a backend spells the mailbox's SQL, which is written in SQLite's (see the module docstring)."""

    mark: str = "?"  # a parameter's placeholder
    prefix: str = ""  # of the tables' names
    types: tuple[tuple[str, str], ...] = ()  # (SQLite's column type, this backend's)

    def sql(self, text: str) -> str:
        """A query in this backend's spelling."""
        return _spelled(self, text)

    def schema(self, text: str) -> str:
        """:data:`SCHEMA` in this backend's spelling (run without parameters)."""
        for word, spelled in self.types:
            text = re.sub(rf"\b{word}\b", spelled, text)
        return TABLE.sub(lambda m: m[1] + m[2] + self.prefix + m[3], text)


@functools.lru_cache(maxsize=256)
def _spelled(dialect: Dialect, text: str) -> str:
    text = TABLE.sub(lambda m: m[1] + m[2] + dialect.prefix + m[3], text)
    return text if dialect.mark == "?" else text.replace("%", "%%").replace("?", dialect.mark)


SQLITE = Dialect()
POSTGRES = Dialect("%s", "odl_pull_", (("REAL", "DOUBLE PRECISION"), ("BLOB", "BYTEA")))


class Tx:
    """One transaction of the mailbox: its queries (SQLite's spelling) run in the backend's."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn, self.dialect = conn, dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The query's cursor (``fetchone``, ``fetchall``, ``rowcount`` on both backends)."""
        return self.conn.execute(self.dialect.sql(sql), tuple(params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """The query once per row of ``rows`` (none: nothing)."""
        if rows:
            with contextlib.closing(self.conn.cursor()) as cur:
                cur.executemany(self.dialect.sql(sql), rows)


class Refused(Exception):
    """A board's request the mailbox does not accept: ``status`` is the HTTP answer it gets (the
    endpoint's answer to a board, not an error of the host's tree: no run ever sees it)."""

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

    @property
    def seen_s(self) -> float | None:
        """Seconds since the board's last check-in (None: it never checked in)."""
        return None if self.last_seen is None else time.time() - self.last_seen


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
    """The mailbox's folder and tables; every method of its parts is one :meth:`tx`. ``blobs`` is the
    folder of its blobs (without a shared store) or of this host's verified copies of the store's."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else pull_home()
        self.blobs = self.root / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.shared = configured_store()
        self.shared_blobs = PgBlobStore(self.shared) if self.shared is not None else None
        self.db: Path | None = None
        self._conns = threading.local()  # each thread's SQLite connection (:meth:`_sqlite`)
        if self.shared is not None:
            _create_tables(self.shared)
            return
        self.db = self.root / "mailbox.sqlite3"
        key = f"{self.db.resolve()}:{self.db.stat().st_ino if self.db.exists() else 0}"
        if key in _MADE:  # a mailbox object per run's link: its file made once per process
            return
        db = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
            db.executescript(SCHEMA)
        finally:
            db.close()
        _MADE.add(f"{self.db.resolve()}:{self.db.stat().st_ino}")

    @contextlib.contextmanager
    def tx(self) -> Iterator[Tx]:
        """One transaction, committed on success: SQLite's ``BEGIN IMMEDIATE`` (writers queue, 30 s at
        most), or the shared store's holding :data:`MAILBOX_LOCK` (the mailbox's writers on every host queue)."""
        if self.shared is not None:
            with self.shared.transaction() as conn:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MAILBOX_LOCK,))
                yield Tx(conn, POSTGRES)
            return
        with self._sqlite("BEGIN IMMEDIATE") as db:
            yield db

    @contextlib.contextmanager
    def read(self) -> Iterator[Tx]:
        """A transaction that only reads: it takes no writer's lock (SQLite's deferred ``BEGIN``, which in
        WAL mode reads a snapshot while a writer commits; the store's transaction without
        :data:`MAILBOX_LOCK`), so the reads of many runs and check-ins do not queue behind each other."""
        if self.shared is not None:
            with self.shared.transaction() as conn:
                yield Tx(conn, POSTGRES)
            return
        with self._sqlite("BEGIN") as db:
            yield db

    @contextlib.contextmanager
    def _sqlite(self, begin: str) -> Iterator[Tx]:
        """A transaction on this thread's connection to the SQLite file (opened once per thread: a
        connection costs more than the queries of a check-in)."""
        db = getattr(self._conns, "db", None)
        if db is None:
            # WAL with NORMAL: a commit is not fsynced on its own (the WAL is, at each checkpoint): a
            # host's power cut may lose its last check-ins, never the database; a board repeats what
            # it sent (events from the host's offset, a result until it is acknowledged)
            db = sqlite3.connect(self.db, timeout=30, isolation_level=None)  # type: ignore[arg-type]
            db.execute("PRAGMA synchronous=NORMAL")
            self._conns.db = db
        db.execute(begin)
        try:
            yield Tx(db, SQLITE)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # a failed query or commit: the kept connection starts clean next time
                db.execute("ROLLBACK")
            raise


_MADE: set[str] = set()  # the SQLite mailboxes (path and inode) whose tables this process has made sure of
_CREATED: set[str] = set()  # the shared stores whose mailbox tables this process has made sure of


def _create_tables(store: SharedStore) -> None:
    """The mailbox's tables in ``store``, once per process (under the store's schema lock)."""
    if store.cfg.url in _CREATED:
        return
    with store.transaction() as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        conn.execute(POSTGRES.schema(SCHEMA))
    _CREATED.add(store.cfg.url)


JOB_COLUMNS = "id, board, kind, state, item, created, deadline, offered, ended, events_len, result, verdict"


def job_from_row(row: tuple[Any, ...]) -> JobRecord:
    item = json.loads(row[4])
    result = json.loads(row[10]) if row[10] else None
    return JobRecord(*row[:4], item, *row[5:10], result, row[11])


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()
