"""Which project home a Prefect server belongs to, and the port this home's stack uses.

``odl stack up`` records an identity in ``$ODL_HOME/stack.json`` and marks its server with the
Prefect variable ``odl_stack_identity`` (``{"identity", "home"}``); every command that talks to a
server (``odl flow``, ``odl watch``, ``odl board check``) uses it only when the mark matches, and
names the owner of a foreign one. The port is this home's last one, else 4200 when free, else any
free port. ``stack.json`` also keeps the alert setting (:mod:`tasks.stack.alerts`)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from tasks.paths import odl_home
from tasks.stack import StackError
from tasks.stack.processes import running_pid


def stack_config(home: Path | None = None) -> dict:
    """What ``up`` last used for ``home`` (``$ODL_HOME/stack.json``): db, pg_port, host, and the
    alert setting (``alerts``); {} before."""
    path = (Path(home) if home else odl_home()) / "stack.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def update_stack_config(home: Path, **values: object) -> dict:
    """Write ``values`` into ``home``'s ``stack.json``, keeping its other keys; the new config."""
    config = {**stack_config(home), **values}
    path = Path(home) / "stack.json"
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(config) + "\n")
    os.replace(tmp, path)
    return config


LOOPBACK = ("127.0.0.1", "localhost", "::1")
AUTH_FILE = "api-auth"  # under PREFECT_HOME: the API's basic-auth credential, 0600


def api_credential(home: Path, host: str) -> str | None:
    """The Prefect API's credential (``user:password``) when the server listens beyond loopback:
    made once under ``$ODL_HOME/prefect/api-auth`` (0600), never printed or logged; None on loopback."""
    if host in LOOPBACK or host.startswith("127."):
        return None
    path = Path(home) / "prefect" / AUTH_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"odl:{secrets.token_urlsafe(24)}\n")
    return path.read_text().strip()


def auth_headers(env: dict[str, str]) -> dict[str, str]:
    """The header that carries ``PREFECT_API_AUTH_STRING`` (Prefect's basic auth), when it is set."""
    cred = env.get("PREFECT_API_AUTH_STRING")
    return {"Authorization": "Basic " + base64.b64encode(cred.encode()).decode()} if cred else {}


def api_healthy(env: dict[str, str]) -> bool:
    """Whether the server at ``PREFECT_API_URL`` answers its health check."""
    try:
        with urllib.request.urlopen(env["PREFECT_API_URL"] + "/health", timeout=2) as resp:
            return json.loads(resp.read() or b"false") is True
    except (OSError, ValueError):
        return False


DEFAULT_PORT = 4200
IDENTITY_VARIABLE = "odl_stack_identity"  # a Prefect variable: which project home a server belongs to


BUSY = (429, 503)  # a server just started (SQLite busy with its own startup writes) answers these
BUSY_WAIT_S = 30.0


def api(env: dict[str, str], method: str, path: str, body: dict | None = None) -> object:
    """One call of the server's REST API (the decoded JSON answer); a busy answer (503, 429) is
    retried for up to 30 s, any other HTTP error raised as ``urllib.error.HTTPError``."""
    data = json.dumps(body).encode() if body is not None else None
    deadline, pause = time.monotonic() + BUSY_WAIT_S, 0.25
    while True:
        req = urllib.request.Request(
            env["PREFECT_API_URL"] + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", **auth_headers(env)},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                raw = resp.read()
            return json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            if exc.code not in BUSY or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 4.0)


def server_owner(env: dict[str, str]) -> dict | None:
    """What the server at ``PREFECT_API_URL`` says it belongs to (``{"identity", "home"}``, the
    variable :func:`up` sets), or None: no server, or one that no ODL stack started."""
    try:
        found = api(env, "GET", f"/variables/name/{IDENTITY_VARIABLE}")
    except (OSError, ValueError):
        return None
    value = found.get("value") if isinstance(found, dict) else None
    return value if isinstance(value, dict) else None


def is_ours(env: dict[str, str]) -> bool:
    """Whether the healthy server at ``PREFECT_API_URL`` is this project home's stack (identity check)."""
    mine = stack_config(Path(env["ODL_HOME"])).get("identity")
    owner = server_owner(env) if mine and api_healthy(env) else None
    return bool(owner) and owner.get("identity") == mine


def foreign_server(env: dict[str, str]) -> str | None:
    """One line when a server answers at ``PREFECT_API_URL`` that is not this home's stack, else None."""
    if not api_healthy(env) or is_ours(env):
        return None
    owner = server_owner(env)
    whose = f"the project home {owner.get('home')}" if owner else "no ODL stack of this home"
    return (
        f"the Prefect server at {env['PREFECT_API_URL'].removesuffix('/api')} belongs to {whose}, "
        f"not to {env['ODL_HOME']}: not used"
    )


def claim(env: dict[str, str], identity: str) -> None:
    """Mark the server as this home's (the identity variable), replacing a stale mark of this home."""
    value = {"identity": identity, "home": env["ODL_HOME"]}
    try:
        api(env, "POST", "/variables/", {"name": IDENTITY_VARIABLE, "value": value})
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise StackError(f"cannot mark the Prefect server as this home's: {exc}") from exc
        api(env, "PATCH", f"/variables/name/{IDENTITY_VARIABLE}", {"value": value})


def free_port(preferred: int = DEFAULT_PORT) -> int:
    """``preferred`` when nothing listens there, else a free port."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise StackError("no free TCP port on 127.0.0.1")


def choose_port(home: Path | None = None) -> int:
    """The port for this home's server: the one it runs on, else the one it last used or 4200 when
    free, else any free port (another home's server, or anything else, may hold it)."""
    home = Path(home) if home else odl_home()
    config = stack_config(home)
    preferred = int(config.get("port") or DEFAULT_PORT)
    if running_pid(home, "prefect-server") is not None and config.get("port"):
        return preferred
    return free_port(preferred)
