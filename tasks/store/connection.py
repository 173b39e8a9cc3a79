"""One connection per process to the shared store, its transactions, and its tables.

A refused login (no password, a wrong one, an unknown user or database) is a :class:`StoreError` in
one line naming ``ODL_STORE_URL`` and what is expected; a server that cannot be reached, or a link
lost in the middle of a transaction (cut, closed by the server, or silent for ``ODL_STORE_TIMEOUT_S``:
:mod:`tasks.store.config`), is a :class:`StoreUnreachable` in one line (retryable): the transaction is
rolled back by the server, so nothing half-written is ever referenced. The tables are created on
first use (``CREATE ... IF NOT EXISTS`` under an advisory lock, since two hosts may start at once).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from tasks.errors import StoreError, StoreUnreachable
from tasks.store.config import PASSWORD_VAR, URL_VAR, StoreConfig

log = logging.getLogger(__name__)

SCHEMA_LOCK = 0x0D1_5C4E  # pg_advisory_xact_lock key: one host creates the tables at a time
SCHEMA = """
CREATE TABLE IF NOT EXISTS odl_blobs (
    sha256 text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size bigint NOT NULL, chunks integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS odl_blob_chunks (
    sha256 text NOT NULL, idx integer NOT NULL, data bytea NOT NULL, PRIMARY KEY (sha256, idx));
CREATE TABLE IF NOT EXISTS odl_registry_entries (
    recipe text NOT NULL, board text NOT NULL, current_number integer,
    PRIMARY KEY (recipe, board));
CREATE TABLE IF NOT EXISTS odl_registry_versions (
    recipe text NOT NULL, board text NOT NULL, number integer NOT NULL CHECK (number > 0),
    promoted boolean NOT NULL, decision text NOT NULL, info text NOT NULL, metrics text NOT NULL,
    recorded_by text NOT NULL, recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (recipe, board, number),
    FOREIGN KEY (recipe, board) REFERENCES odl_registry_entries (recipe, board));
CREATE TABLE IF NOT EXISTS odl_registry_files (
    recipe text NOT NULL, board text NOT NULL, number integer NOT NULL, name text NOT NULL,
    sha256 text NOT NULL REFERENCES odl_blobs (sha256),
    PRIMARY KEY (recipe, board, number, name),
    FOREIGN KEY (recipe, board, number) REFERENCES odl_registry_versions (recipe, board, number));
CREATE TABLE IF NOT EXISTS odl_registry_history (
    id bigserial PRIMARY KEY, recipe text NOT NULL, board text NOT NULL, number integer NOT NULL,
    action text NOT NULL, at double precision NOT NULL,
    FOREIGN KEY (recipe, board, number) REFERENCES odl_registry_versions (recipe, board, number));
CREATE TABLE IF NOT EXISTS odl_documents (
    name text PRIMARY KEY, content bytea NOT NULL, sha256 text NOT NULL, revision bigint NOT NULL,
    updated_by text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
"""


def _refusal(cfg: StoreConfig, exc: psycopg.Error) -> StoreError:
    """The one line for a failed connection: refused credentials (StoreError) or no server (retryable)."""
    text = " ".join(str(exc).split())
    why = text.rsplit("FATAL:", 1)[-1].strip() if "FATAL:" in text else text.rsplit(": ", 1)[-1]
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate.startswith("28") or "password" in text or "authentication" in text:
        return StoreError(
            f"{URL_VAR}={cfg.url}: the server refused user {cfg.user} ({why}); expected the user's password "
            f"in the file named by {PASSWORD_VAR} (mode 0600) or in ~/.pgpass"
        )
    if sqlstate == "3D000" or "does not exist" in text:
        return StoreError(f"{URL_VAR}={cfg.url}: {why}; expected an existing database the user may use")
    return StoreUnreachable(f"{URL_VAR}={cfg.url}: the store cannot be reached ({why})")


LOST_STATES = ("08", "57P", "25P03")  # connection exceptions; terminated (admin, shutdown); idle too long


def _link_lost(conn: psycopg.Connection, exc: psycopg.Error) -> bool:
    """Whether ``exc`` means the session is gone (the link cut, the server's end closed it, or it
    rolled back a transaction that sat idle past ODL_STORE_TIMEOUT_S): the work may be tried again."""
    state = getattr(exc, "sqlstate", None) or ""
    return isinstance(exc, psycopg.OperationalError) or conn.broken or state.startswith(LOST_STATES)


class Store:
    """This process's connection to the shared store at ``cfg`` (opened on first use, reopened after a
    fork or a lost link); :meth:`transaction` is the only way to use it."""

    def __init__(self, cfg: StoreConfig) -> None:
        self.cfg = cfg
        self.host = os.uname().nodename
        self._conn: psycopg.Connection | None = None
        self._pid = 0
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"Store({self.cfg.url})"

    def _connection(self) -> psycopg.Connection:
        if self._conn is not None and self._pid == os.getpid() and not self._conn.closed:
            return self._conn
        try:
            conn = psycopg.connect(**self.cfg.connect_kwargs(), autocommit=True)
        except psycopg.Error as exc:
            raise _refusal(self.cfg, exc) from None
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                conn.execute(SCHEMA)
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"{URL_VAR}={self.cfg.url}: cannot create the store's tables ({exc}); expected "
                             "a user allowed to create tables in the database") from None  # fmt: skip
        log.info("shared store %s: connected as host %s", self.cfg.url, self.host)
        self._conn, self._pid = conn, os.getpid()
        return conn

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """A transaction on the store: committed when the block ends, rolled back if it raises."""
        with self._lock:
            conn = self._connection()
            try:
                with conn.transaction():
                    yield conn
            except psycopg.Error as exc:
                if not _link_lost(conn, exc):
                    raise
                self._conn = None
                conn.close()
                why = " ".join(str(exc).split())  # libpq's text runs over several lines
                raise StoreUnreachable(f"{URL_VAR}={self.cfg.url}: lost the store ({why}); nothing of this "
                                       "transaction was committed, run again") from None  # fmt: skip

    def check(self) -> None:
        """Connect now (StoreError in one line when this host is refused, StoreUnreachable without a server)."""
        with self.transaction():
            pass

    def close(self) -> None:
        """Close the connection (a later transaction opens a new one)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


_STORES: dict[tuple[str, str | None, float], Store] = {}
_STORES_LOCK = threading.Lock()


def open_store(cfg: StoreConfig) -> Store:
    """The process's one :class:`Store` for ``cfg`` (its connection is opened on first use)."""
    with _STORES_LOCK:
        key = (cfg.url, cfg.password, cfg.timeout_s)
        if key not in _STORES:
            _STORES[key] = Store(cfg)
        return _STORES[key]
