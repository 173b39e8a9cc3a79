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

import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tasks.paths import PROJECT_ROOT, odl_home
from tasks.stack import StackError, postgres
from tasks.stack.automations import install_automations
from tasks.stack.ownership import (
    DEFAULT_PORT,
    api_credential,
    api_healthy,
    claim,
    foreign_server,
    stack_config,
    update_stack_config,
)
from tasks.stack.processes import running_pid, spawn, stop_service, stop_services

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
        # a run's logs reach `prefect deployment run --watch` (and other log subscribers): the
        # watch then ends on the verdict's log line and the report's link, not on the state's name
        PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED="true",
        PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED="true",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PREFECT_PROFILES_PATH", None)
    env.pop("PREFECT_SERVER_API_AUTH_STRING", None)
    env.pop("PREFECT_API_AUTH_STRING", None)
    credential = api_credential(home, host)  # a server reachable beyond loopback takes basic auth
    if credential:
        env.update(PREFECT_SERVER_API_AUTH_STRING=credential, PREFECT_API_AUTH_STRING=credential)
    if db == "postgres":
        env["ODL_PG_PORT"] = str(pg_port or config.get("pg_port") or postgres.DEFAULT_PORT)
        env.pop("PREFECT_SERVER_DATABASE_CONNECTION_URL", None)  # it would win over the one below
        url = postgres.connection_url(home, int(env["ODL_PG_PORT"]))  # None until up creates the cluster
        if url:
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = url
    return env


def api_settings(env: dict[str, str]) -> dict:
    """Prefect settings that point this process's client at the stack of ``env`` (for
    ``temporary_settings``): its API and, when it listens beyond loopback, its credential."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

    settings: dict = {PREFECT_API_URL: env["PREFECT_API_URL"]}
    if env.get("PREFECT_API_AUTH_STRING"):
        settings[PREFECT_API_AUTH_STRING] = env["PREFECT_API_AUTH_STRING"]
    return settings


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


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
    update_stack_config(home, **config)  # first: down stops what starts here; the alert setting kept
    if running_pid(home, "prefect-server") is None and api_healthy(env):
        raise StackError(foreign_server(env) or f"port {port} is taken")
    pids = {}
    if db == "postgres":
        pids["postgres"] = postgres.start(home, pg_port)
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = postgres.connection_url(home, pg_port)
    pids["prefect-server"] = start_server(env)
    claim(env, identity)
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
    # the workers first (together), then the server they talk to
    stopped = stop_services([(home, s) for s in worker_services(home)], timeout)
    stopped += ["prefect-server"] if stop_service(home, "prefect-server", timeout) else []
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
