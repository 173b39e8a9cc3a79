"""The local Prefect stack of the demo: server (embedded SQLite), process work pool, deployment, worker.

State lives under the ODL state folder: ``$ODL_HOME/prefect`` (PREFECT_HOME: database, results),
``$ODL_HOME/run/*.pid`` (processes this module started), ``$ODL_HOME/logs/*.log``. Processes are
started in their own session and stopped by the pids recorded here, never by name.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tasks.errors import HostExit, PipelineError
from tasks.paths import PROJECT_ROOT, odl_home

log = logging.getLogger(__name__)

POOL = "odl-pool"
PREFECT_FILE = PROJECT_ROOT / "deploy" / "prefect.yaml"
SERVICES = ("worker", "prefect-server")  # stop order


class StackError(PipelineError):
    """The local Prefect stack could not be started, deployed or stopped."""

    exit_code = HostExit.STACK


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


def stack_env(port: int = 4200, home: Path | None = None) -> dict[str, str]:
    """Environment for every process of the stack (server, CLI, worker and its flow runs)."""
    home = Path(home) if home else odl_home()
    env = dict(os.environ)
    env.update(
        ODL_HOME=str(home),
        ODL_PROJECT_ROOT=str(PROJECT_ROOT),
        ODL_TIMEZONE=local_timezone(),
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
        PREFECT_SERVER_API_HOST="127.0.0.1",
        PREFECT_SERVER_API_PORT=str(port),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="1",
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_LOGGING_EXTRA_LOGGERS="tasks,device_agent,flows",
        PREFECT_RESULTS_PERSIST_BY_DEFAULT="true",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PREFECT_PROFILES_PATH", None)
    return env


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _pidfile(home: Path, service: str) -> Path:
    run = home / "run"
    run.mkdir(parents=True, exist_ok=True)
    return run / f"{service}.pid"


def running_pid(home: Path, service: str) -> int | None:
    """The pid recorded for a service if that process is still alive and is a prefect process."""
    pidfile = _pidfile(home, service)
    if not pidfile.is_file():
        return None
    pid = int(pidfile.read_text().split()[0])
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    if state in ("Z", "X"):
        return None
    # an empty cmdline is a child still between fork and exec; any other command is a reused pid
    return pid if not cmdline or b"prefect" in cmdline else None


def _spawn(env: dict[str, str], service: str, argv: list[str]) -> int:
    home = Path(env["ODL_HOME"])
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{service}.log", "ab") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _pidfile(home, service).write_text(f"{proc.pid}\n")
    log.info("started %s (pid %d), log %s", service, proc.pid, logs / f"{service}.log")
    return proc.pid


def api_healthy(env: dict[str, str]) -> bool:
    """Whether the server at ``PREFECT_API_URL`` answers its health check."""
    try:
        with urllib.request.urlopen(env["PREFECT_API_URL"] + "/health", timeout=2) as resp:
            return json.loads(resp.read() or b"false") is True
    except (OSError, ValueError):
        return False


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
            "127.0.0.1",
            "--port",
            env["PREFECT_SERVER_API_PORT"],
        ]
        pid = _spawn(env, "prefect-server", argv)
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


def start_worker(env: dict[str, str], pool: str = POOL) -> int:
    """Start a process worker on ``pool`` in the background (unless one is recorded and alive)."""
    pid = running_pid(Path(env["ODL_HOME"]), "worker")
    if pid is None:
        pid = _spawn(env, "worker", [_bin("prefect"), "worker", "start", "--pool", pool, "--type", "process"])
    return pid


def up(env: dict[str, str]) -> dict[str, int]:
    """Server, work pool, deployment and worker: everything ``prefect deployment run odl/full`` needs."""
    pids = {"prefect-server": start_server(env)}
    deploy(env)
    pids["worker"] = start_worker(env)
    return pids


def _stop_one(home: Path, service: str, timeout: float) -> bool:
    pid = running_pid(home, service)
    _pidfile(home, service).unlink(missing_ok=True) if pid is None else None
    if pid is None:
        return False
    deadline = time.monotonic() + timeout
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):  # a worker needs SIGTERM twice
        try:
            os.killpg(pid, sig)  # its own session: the group id is its pid
        except ProcessLookupError:
            break
        while running_pid(home, service) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not running_pid(home, service):
            break
        deadline = time.monotonic() + timeout
    _pidfile(home, service).unlink(missing_ok=True)
    log.info("stopped %s (pid %d)", service, pid)
    return True


def down(home: Path | None = None, timeout: float = 10.0) -> list[str]:
    """Stop the worker and the server started by :func:`up` (by their recorded pids); keeps the data."""
    home = Path(home) if home else odl_home()
    return [s for s in SERVICES if _stop_one(home, s, timeout)]


def status(home: Path | None = None) -> dict[str, int | None]:
    """The recorded pid of each service if it is alive, else None."""
    home = Path(home) if home else odl_home()
    return {s: running_pid(home, s) for s in SERVICES}
