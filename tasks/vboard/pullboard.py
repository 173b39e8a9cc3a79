"""A virtual board in pull mode: behind its NAT router (:mod:`tasks.vboard.natnet`), with no sshd
(nothing on it can be reached), enrolled and checking in exactly as a user sets up a real one.

``odl board up NAME --pull`` builds the board's user and Python environment as for any virtual
board, then does what the tutorial "A board that can only dial out" asks of a user: the endpoint
runs at an address the boards reach (this home's lab gateway: the command starts it there), ``odl board enrol`` makes the
inventory entry and a one-time code, the agent is copied to the board, and on the board, as its
own Unix user inside its namespace, ``python3 -m device_agent enrol ...`` then the service
``python3 -m device_agent pull`` (recorded in ``$ODL_HOME/boards/NAME/pull.pid``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import device_agent
from tasks.board.inventory import Board, save_board
from tasks.board.pull.mailbox import Mailbox
from tasks.errors import BoardError
from tasks.vboard.sshd import read_pid, sh

AGENT_SRC = Path(device_agent.__file__).resolve().parent


def as_board(state: dict[str, Any], *argv: str) -> list[str]:
    """``argv`` run on the board: in its namespace, as its own Unix user, with its agent on the path."""
    agent = Path(state["home"]) / "odl" / "agent"
    extra = [f"{k}={v}" for k, v in (state.get("env") or {}).items()]  # board_up(env=...): its sessions'
    return ["nsenter", f"--net=/run/netns/{state['netns']}", "runuser", "-u", state["user"], "--",
            "env", f"HOME={state['home']}", f"PYTHONPATH={agent}", "PYTHONUNBUFFERED=1", *extra, *argv]  # fmt: skip


def install_agent_copy(state: dict[str, Any]) -> None:
    """Copy the agent package to the board (what a user does with scp or an SD card)."""
    root = Path(state["home"]) / "odl"
    dest = root / "agent" / "device_agent"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(AGENT_SRC, dest, ignore=shutil.ignore_patterns("__pycache__"))
    sh(["chown", "-R", f"{state['user']}:{state['user']}", str(root)])


def entry(name: str, state: dict[str, Any]) -> Board:
    """The board's inventory entry (``transport = "pull"``)."""
    return Board(name, f"{state['home']}/odl", transport="pull", python=state["python"],
                 ort_version=state["ort_version"], arch=state.get("arch", ""),
                 runtimes=tuple(state.get("runtimes") or ()))  # fmt: skip


def enrol(name: str, state: dict[str, Any], url: str, pin: str) -> dict[str, Any]:
    """The inventory entry and a one-time code, then the board's own ``enrol`` with it."""
    root = f"{state['home']}/odl"
    save_board(entry(name, state))
    code = Mailbox().invite(name)
    argv = as_board(state, state["python"], "-m", "device_agent", "--root", root, "enrol",
                    "--endpoint", url, "--pin", pin, "--name", name, "--code", code)  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise BoardError(f"board {name}: enrol failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def start_service(bdir: Path, state: dict[str, Any]) -> int:
    """Start the board's pull service (detached, its own session); its pid."""
    root = f"{state['home']}/odl"
    argv = as_board(state, state["python"], "-m", "device_agent", "--root", root, "pull")
    with open(bdir / "pull.log", "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYTHONPATH": ""})  # fmt: skip
    (bdir / "pull.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 10  # until the service itself runs, past nsenter and runuser: a stop
    while not _services(state["user"]) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # right after would otherwise race runuser and leave the service running
    return proc.pid


def _services(user: str) -> list[int]:
    """The pids of the pull services (``python -m device_agent ... pull``) of Unix user ``user``."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return []
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and proc.stat().st_uid == uid:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if b"device_agent" in argv and b"pull" in argv:
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


def service_alive(bdir: Path) -> bool:
    """True when the board's pull service runs."""
    pid = read_pid(bdir / "pull.pid")
    if pid is None:
        return False
    try:
        return b"device_agent" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_service(bdir: Path, timeout: float = 10.0) -> bool:
    """Stop the board's pull service (SIGTERM to its session, SIGKILL after ``timeout``); whether it ran."""
    pid, alive = read_pid(bdir / "pull.pid"), service_alive(bdir)
    if pid is not None and alive:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + timeout
            while service_alive(bdir) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not service_alive(bdir):
                break
    (bdir / "pull.pid").unlink(missing_ok=True)
    user = _user(bdir)
    for pid in _services(user) if user else []:  # one its session's signal did not reach: none may stay
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            alive = True
    return alive


def _user(bdir: Path) -> str | None:
    try:
        return str(json.loads((bdir / "state.json").read_text())["user"])
    except (OSError, KeyError, ValueError):
        return None
