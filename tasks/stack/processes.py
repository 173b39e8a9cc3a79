"""The service processes of the stack (Prefect server, workers, PostgreSQL): started in their own
session with their pid recorded in ``$ODL_HOME/run/<service>.pid`` and their output in
``$ODL_HOME/logs/<service>.log``, found alive by that pid and stopped by signalling its session,
never by name."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tasks.paths import PROJECT_ROOT

log = logging.getLogger(__name__)

# what a service's command line holds (the others are Prefect's): a pid reused by another program is not it
MARKERS = {"postgres": b"postgres", "endpoint": b"tasks.stack.endpoint"}


def pidfile(home: Path, service: str) -> Path:
    """The file that records the pid of ``service`` (``$ODL_HOME/run/<service>.pid``; folder created)."""
    run = home / "run"
    run.mkdir(parents=True, exist_ok=True)
    return run / f"{service}.pid"


def running_pid(home: Path, service: str) -> int | None:
    """The pid recorded for a service if that process is still alive and is a prefect (postgres) process."""
    recorded = pidfile(home, service)
    if not recorded.is_file():
        return None
    pid = int(recorded.read_text().split()[0])
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    if state in ("Z", "X"):
        return None
    # an empty cmdline is a child still between fork and exec; any other command is a reused pid
    marker = MARKERS.get(service, b"prefect")
    return pid if not cmdline or marker in cmdline else None


def spawn(env: dict[str, str], service: str, argv: list[str]) -> int:
    """Start ``argv`` as ``service`` in its own session (output appended to its log), record its pid."""
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
    pidfile(home, service).write_text(f"{proc.pid}\n")
    log.info("started %s (pid %d), log %s", service, proc.pid, logs / f"{service}.log")
    return proc.pid


def stop_service(home: Path, service: str, timeout: float) -> bool:
    """Stop the recorded ``service`` (SIGTERM twice, then SIGKILL, each given ``timeout`` seconds to
    work) and forget its pid; whether it was running."""
    pid = running_pid(home, service)
    if pid is None:
        pidfile(home, service).unlink(missing_ok=True)
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
    pidfile(home, service).unlink(missing_ok=True)
    log.info("stopped %s (pid %d)", service, pid)
    return True


def stop_services(services: list[tuple[Path, str]], timeout: float) -> list[str]:
    """:func:`stop_service` for each ``(home, service)`` at once (a worker's shutdown takes seconds:
    their waits overlap instead of adding up); the services that were running, in the given order."""
    if not services:
        return []
    with ThreadPoolExecutor(max_workers=len(services)) as pool:
        ran = list(pool.map(lambda hs: stop_service(hs[0], hs[1], timeout), services))
    return [service for (_, service), was in zip(services, ran, strict=True) if was]
