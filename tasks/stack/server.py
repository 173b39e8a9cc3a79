"""The local Prefect stack of the demo: server, process work pool, deployments, process worker(s).

The database is embedded SQLite (default) or a private PostgreSQL cluster (:mod:`tasks.stack.postgres`);
``up`` records the choice in ``$ODL_HOME/stack.json`` for later ``stack_env`` calls (status, deploy,
down, CLI).

State lives under the ODL state folder: ``$ODL_HOME/prefect`` (PREFECT_HOME: SQLite database, results),
``$ODL_HOME/run/*.pid`` (processes this module started), ``$ODL_HOME/logs/*.log``. Processes are
started in their own session and stopped by the pids recorded there, never by name
(:mod:`tasks.stack.processes`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tasks.paths import PROJECT_ROOT, odl_home
from tasks.stack import StackError, postgres
from tasks.stack.automations import automations
from tasks.stack.processes import running_pid, spawn, stop_service

POOL = "odl-pool"
PREFECT_FILE = PROJECT_ROOT / "deploy" / "prefect.yaml"
DATABASES = ("sqlite", "postgres")


def local_timezone() -> str:
    """The machine's IANA timezone (``$TZ``, /etc/timezone, the /etc/localtime link), else UTC."""
    if os.environ.get("TZ", "").strip(":"):
        return os.environ["TZ"].strip(":")
    tzfile = Path("/etc/timezone")
    if tzfile.is_file() and tzfile.read_text().strip():
        return tzfile.read_text().strip()
    link = Path("/etc/localtime")
    if link.is_symlink() and "zoneinfo/" in os.readlink(link):
        return os.readlink(link).split("zoneinfo/", 1)[1]
    return "UTC"


def stack_config(home: Path | None = None) -> dict:
    """What ``up`` last used for ``home`` (``$ODL_HOME/stack.json``): db, pg_port, host; {} before."""
    path = (Path(home) if home else odl_home()) / "stack.json"
    return json.loads(path.read_text()) if path.is_file() else {}


DEFAULT_PORT = 4200
IDENTITY_VARIABLE = "odl_stack_identity"  # a Prefect variable: which project home a server belongs to


def stack_env(
    port: int | None = None,
    home: Path | None = None,
    db: str | None = None,
    pg_port: int | None = None,
    host: str | None = None,
) -> dict[str, str]:
    """Environment for every process of the stack (server, CLI, worker and its flow runs).

    ``port``, ``db``, ``pg_port`` and ``host`` (the address the server listens on) default to what
    ``up`` last used for ``home`` (:func:`stack_config`), else 4200, sqlite, 5433 and 127.0.0.1."""
    home = Path(home) if home else odl_home()
    config = stack_config(home)
    port = port or int(config.get("port") or DEFAULT_PORT)
    db = db or config.get("db", "sqlite")
    if db not in DATABASES:
        raise StackError(f"unknown database {db!r} for the Prefect server: one of {', '.join(DATABASES)}")
    host = host or config.get("host", "127.0.0.1")
    env = dict(os.environ)
    env.update(
        ODL_HOME=str(home),
        ODL_PROJECT_ROOT=str(PROJECT_ROOT),
        ODL_TIMEZONE=local_timezone(),
        ODL_STACK_DB=db,
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_API_URL=f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/api",
        PREFECT_SERVER_API_HOST=host,
        PREFECT_SERVER_API_PORT=str(port),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="1",
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_LOGGING_EXTRA_LOGGERS="tasks,device_agent,flows",
        PREFECT_RESULTS_PERSIST_BY_DEFAULT="true",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PREFECT_PROFILES_PATH", None)
    if db == "postgres":
        env["ODL_PG_PORT"] = str(pg_port or config.get("pg_port") or postgres.DEFAULT_PORT)
        env.pop("PREFECT_SERVER_DATABASE_CONNECTION_URL", None)  # it would win over the one below
        url = postgres.connection_url(home, int(env["ODL_PG_PORT"]))  # None until up creates the cluster
        if url:
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = url
    return env


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def api_healthy(env: dict[str, str]) -> bool:
    """Whether the server at ``PREFECT_API_URL`` answers its health check."""
    try:
        with urllib.request.urlopen(env["PREFECT_API_URL"] + "/health", timeout=2) as resp:
            return json.loads(resp.read() or b"false") is True
    except (OSError, ValueError):
        return False


def _api(env: dict[str, str], method: str, path: str, body: dict | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        env["PREFECT_API_URL"] + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def server_owner(env: dict[str, str]) -> dict | None:
    """What the server at ``PREFECT_API_URL`` says it belongs to (``{"identity", "home"}``, the
    variable :func:`up` sets), or None: no server, or one that no ODL stack started."""
    try:
        found = _api(env, "GET", f"/variables/name/{IDENTITY_VARIABLE}")
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


def _claim(env: dict[str, str], identity: str) -> None:
    """Mark the server as this home's (the identity variable), replacing a stale mark of this home."""
    value = {"identity": identity, "home": env["ODL_HOME"]}
    try:
        _api(env, "POST", "/variables/", {"name": IDENTITY_VARIABLE, "value": value})
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise StackError(f"cannot mark the Prefect server as this home's: {exc}") from exc
        _api(env, "PATCH", f"/variables/name/{IDENTITY_VARIABLE}", {"value": value})


def install_automations(env: dict[str, str]) -> list[str]:
    """Create (or replace, by name) the automations of :func:`tasks.prefect.boards.automations`."""
    names = []
    for body in automations():
        found = _api(env, "POST", "/automations/filter", {"automations": {"name": {"any_": [body["name"]]}}})
        for old in found or []:
            _api(env, "DELETE", f"/automations/{old['id']}")
        _api(env, "POST", "/automations/", body)
        names.append(body["name"])
    return names


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


def start_server(env: dict[str, str], timeout: float = 120.0) -> int:
    """Start ``prefect server start`` in the background (unless running) and wait for its health check."""
    home = Path(env["ODL_HOME"])
    pid = running_pid(home, "prefect-server")
    if pid is None:
        argv = [
            _bin("prefect"),
            "server",
            "start",
            "--host",
            env["PREFECT_SERVER_API_HOST"],
            "--port",
            env["PREFECT_SERVER_API_PORT"],
        ]
        pid = spawn(env, "prefect-server", argv)
    deadline = time.monotonic() + timeout
    while not api_healthy(env):
        if running_pid(home, "prefect-server") is None:
            raise StackError(f"prefect server exited at start; see {home / 'logs' / 'prefect-server.log'}")
        if time.monotonic() > deadline:
            raise StackError(f"prefect server not healthy after {timeout:.0f} s at {env['PREFECT_API_URL']}")
        time.sleep(0.5)
    return pid


def prefect_cli(env: dict[str, str], *args: str, timeout: float = 180.0) -> str:
    """Run a ``prefect`` CLI command against the stack; returns its output, raises StackError on failure."""
    argv = [_bin("prefect"), "--no-prompt", *args]
    proc = subprocess.run(argv, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise StackError(
            f"{' '.join(argv[1:])} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-1500:]}"
        )
    return proc.stdout


def deploy(env: dict[str, str], prefect_file: Path = PREFECT_FILE, pool: str = POOL) -> None:
    """Create the process work pool (if missing) and deploy every deployment of ``prefect_file``."""
    try:
        prefect_cli(env, "work-pool", "inspect", pool)
    except StackError:
        prefect_cli(env, "work-pool", "create", pool, "--type", "process")
    prefect_cli(env, "deploy", "--all", "--prefect-file", str(prefect_file))


def worker_service(n: int) -> str:
    """The service name of the n-th worker (1-based): ``worker``, ``worker-2``, ..."""
    return "worker" if n == 1 else f"worker-{n}"


def worker_name(service: str) -> str:
    """The name the worker registers on the pool: ``<host>-worker``, ``<host>-worker-2``, ..."""
    return f"{socket.gethostname()}-{service}"


def worker_services(home: Path) -> list[str]:
    """``worker`` and every other worker service with a pidfile, in order."""
    pidfiles = (home / "run").glob("worker*.pid")
    found = {"worker"} | {p.stem for p in pidfiles if re.fullmatch(r"worker(-\d+)?", p.stem)}
    return sorted(found, key=lambda s: int(s.partition("-")[2] or 1))


def start_worker(env: dict[str, str], pool: str = POOL, service: str = "worker") -> int:
    """Start a process worker on ``pool`` in the background (unless one is recorded and alive).
    Neither it nor its flow runs get the database URL (they talk to the API only)."""
    pid = running_pid(Path(env["ODL_HOME"]), service)
    if pid is None:
        argv = [_bin("prefect"), "worker", "start", "--pool", pool, "--type", "process"]
        wenv = {k: v for k, v in env.items() if not k.endswith("_DATABASE_CONNECTION_URL")}
        pid = spawn(wenv, service, [*argv, "--name", worker_name(service)])
    return pid


def up(env: dict[str, str], workers: int = 1) -> dict[str, int]:
    """[PostgreSQL,] server, work pool, deployments and ``workers`` process workers (stopping any beyond
    that number): everything ``prefect deployment run odl/full`` needs. Records the database choice."""
    home = Path(env["ODL_HOME"])
    db, was = env.get("ODL_STACK_DB", "sqlite"), stack_config(home).get("db", "sqlite")
    if db != was and (running_pid(home, "prefect-server") or running_pid(home, "postgres")):
        raise StackError(f"the stack of {home} runs on {was}: `odl stack down` first to switch to {db}")
    pg_port = int(env.get("ODL_PG_PORT") or 0) or None
    home.mkdir(parents=True, exist_ok=True)
    identity = stack_config(home).get("identity") or uuid.uuid4().hex
    port = int(env["PREFECT_SERVER_API_PORT"])
    config = {"db": db, "host": env["PREFECT_SERVER_API_HOST"], "pg_port": pg_port, "port": port,
              "identity": identity, "url": env["PREFECT_API_URL"].removesuffix("/api")}  # fmt: skip
    (home / "stack.json").write_text(json.dumps(config) + "\n")  # first: down stops what starts here
    if running_pid(home, "prefect-server") is None and api_healthy(env):
        raise StackError(foreign_server(env) or f"port {port} is taken")
    pids = {}
    if db == "postgres":
        pids["postgres"] = postgres.start(home, pg_port)
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = postgres.connection_url(home, pg_port)
    pids["prefect-server"] = start_server(env)
    _claim(env, identity)
    install_automations(env)
    deploy(env)
    for n in range(1, workers + 1):
        pids[worker_service(n)] = start_worker(env, service=worker_service(n))
    for extra in worker_services(home)[max(workers, 1) :]:
        stop_service(home, extra, 10.0)
    return pids


def down(home: Path | None = None, timeout: float = 10.0) -> list[str]:
    """Stop the workers, the server and PostgreSQL started by :func:`up` (recorded pids); keeps the data."""
    home = Path(home) if home else odl_home()
    stopped = [s for s in [*worker_services(home), "prefect-server"] if stop_service(home, s, timeout)]
    if (home / "run" / "postgres.pid").is_file() or (home / "postgres").exists():
        stopped += ["postgres"] if postgres.stop(home) else []
    return stopped


def status(home: Path | None = None) -> dict[str, int | None]:
    """The recorded pid of each service (every worker, the server, PostgreSQL if used) if alive, else None."""
    home = Path(home) if home else odl_home()
    services = [*worker_services(home), "prefect-server"]
    if stack_config(home).get("db") == "postgres" or (home / "run" / "postgres.pid").is_file():
        services.append("postgres")
    return {s: running_pid(home, s) for s in services}
