"""Which shared store this host uses, read from its environment (never from a flow parameter).

``ODL_STORE_URL=postgresql://USER@HOST:PORT/DB`` selects the shared store; unset, every piece of state
stays in the local ``$ODL_HOME`` (the embedded default). The URL never holds the password (it is
logged and shown): the password comes from the file named by ``ODL_STORE_PASSWORD_FILE`` (one line,
mode 0600), else libpq finds it in its password file (``~/.pgpass`` or ``$PGPASSFILE``). A URL with
a password, a password file that is missing, empty or readable by others, refuse the host with one
line (:class:`StoreError`) naming the variable and what is expected.

``ODL_STORE_TIMEOUT_S`` (default 30) bounds how long either end waits for the other once the link
is cut. The host: to connect, and on an open connection (TCP keepalives and ``tcp_user_timeout``), so
a host cut off mid-run fails retryably within that time instead of waiting out the kernel's
retransmissions (about 15 min); a wait for a lock another host holds is not cut short (the server's
kernel answers meanwhile). The server, for this session: the same keepalives, and a transaction left
idle that long is rolled back (``idle_in_transaction_session_timeout``), so the locks of a host cut
off mid-transaction are released for the others (no transaction here waits on its client's work).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tasks.errors import StoreError

URL_VAR = "ODL_STORE_URL"
PASSWORD_VAR = "ODL_STORE_PASSWORD_FILE"
TIMEOUT_VAR = "ODL_STORE_TIMEOUT_S"
EXPECTED_URL = "postgresql://USER@HOST:PORT/DB (no password in it)"
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class StoreConfig:
    """Where the shared store is and how to log in; ``password`` is kept out of repr and of ``url``."""

    url: str  # without a password: safe to log
    user: str
    host: str
    port: int
    dbname: str
    password: str | None = field(default=None, repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S  # a store out of reach fails within this (ODL_STORE_TIMEOUT_S)

    @property
    def identity(self) -> str:
        """What the store is called in messages and logs (the URL, no secret)."""
        return self.url

    def connect_kwargs(self) -> dict[str, object]:
        """psycopg.connect's keywords; the password only when it came from ODL_STORE_PASSWORD_FILE."""
        ms, idle, every = (
            round(self.timeout_s * 1000),
            max(1, round(self.timeout_s / 3)),
            max(1, round(self.timeout_s / 6)),
        )
        server = {"idle_in_transaction_session_timeout": ms, "tcp_user_timeout": ms, "tcp_keepalives_idle": idle,
                  "tcp_keepalives_interval": every, "tcp_keepalives_count": 3}  # fmt: skip
        kw: dict[str, object] = {"host": self.host, "port": self.port, "user": self.user, "dbname": self.dbname,
                                 "application_name": "odl", "connect_timeout": max(2, round(self.timeout_s)),
                                 "tcp_user_timeout": ms, "keepalives": 1, "keepalives_idle": idle,
                                 "keepalives_interval": every, "keepalives_count": 3,
                                 "options": " ".join(f"-c {k}={v}" for k, v in server.items())}  # fmt: skip
        if self.password is not None:
            kw["password"] = self.password
        return kw


def parse_url(url: str) -> tuple[str, str, int, str]:
    """(user, host, port, dbname) of ``url``; StoreError in one line when it is not of the expected form."""
    try:
        parts = urlsplit(url)
        port = parts.port or 5432
    except ValueError as exc:
        raise StoreError(f"{URL_VAR}: expected {EXPECTED_URL} ({exc})") from None
    if parts.password is not None:
        raise StoreError(
            f"{URL_VAR}: holds a password; expected {EXPECTED_URL}, the password in the file named by "
            f"{PASSWORD_VAR} or in ~/.pgpass"
        )
    dbname = unquote(parts.path.lstrip("/"))
    if (
        parts.scheme not in ("postgresql", "postgres")
        or not parts.hostname
        or not parts.username
        or not dbname
    ):
        shown = f"{parts.scheme}://{parts.hostname or ''}{parts.path}"  # what was given, never a secret
        raise StoreError(f"{URL_VAR}: expected {EXPECTED_URL} (got {shown!r})")
    return unquote(parts.username), parts.hostname, port, dbname


def read_password_file(path: str) -> str:
    """The password in ``path``; StoreError naming the variable when the file is missing, empty or open to others."""
    file = Path(path).expanduser()
    try:
        mode = file.stat().st_mode
        text = file.read_text().strip()
    except OSError as exc:
        raise StoreError(f"{PASSWORD_VAR}={file}: cannot read it ({exc.strerror}); expected a file holding "
                         "the store password, mode 0600") from None  # fmt: skip
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise StoreError(f"{PASSWORD_VAR}={file}: mode {stat.S_IMODE(mode):04o} lets others read it; "
                         "expected mode 0600 (chmod 600)")  # fmt: skip
    if not text or "\n" in text:
        raise StoreError(f"{PASSWORD_VAR}={file}: expected one line holding the store password")
    return text


def store_config(env: dict[str, str] | None = None) -> StoreConfig | None:
    """The shared store this host is configured for, None when ``ODL_STORE_URL`` is unset (local state only)."""
    env = os.environ if env is None else env
    url = (env.get(URL_VAR) or "").strip()
    if not url:
        return None
    user, host, port, dbname = parse_url(url)
    pwfile = (env.get(PASSWORD_VAR) or "").strip()
    password = read_password_file(pwfile) if pwfile else None
    url = f"postgresql://{user}@{host}:{port}/{dbname}"
    return StoreConfig(url, user, host, port, dbname, password, read_timeout(env))


def read_timeout(env: dict[str, str]) -> float:
    """``ODL_STORE_TIMEOUT_S`` in seconds (default 30); StoreError in one line when it is not in [2, 3600]."""
    text = (env.get(TIMEOUT_VAR) or "").strip()
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not 2 <= value <= 3600:
        raise StoreError(
            f"{TIMEOUT_VAR}={text}: expected seconds in [2, 3600] (default {DEFAULT_TIMEOUT_S:g})"
        )
    return value
