"""Link faults of a virtual board (fault injection for tests and benchmarks): its interface taken
down and up, its sshd restarted with every SSH session it serves dropped."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tasks.errors import BoardError
from tasks.vboard.lifecycle import board_dir, load_state, start_board_sshd
from tasks.vboard.sshd import port_open, read_pid, sh, sshd_alive, stop_pidfile


def set_link(name: str, up: bool) -> None:
    """Bring the board's network interface up or down (fault injection; netns boards only)."""
    state = load_state(board_dir(name))
    if not state.get("netns"):
        raise BoardError(f"board {name}: link control needs a network-namespace board")
    sh(
        [
            "ip",
            "netns",
            "exec",
            state["netns"],
            "ip",
            "link",
            "set",
            state["veth_board"],
            "up" if up else "down",
        ]
    )


def restart_sshd(name: str, down_s: float = 0.0) -> None:
    """Stop the board's sshd and every SSH session it serves (a reboot-like drop of all
    connections; processes detached from SSH, like a training agent, keep running), wait
    ``down_s`` seconds, then start it again (fault injection)."""
    bdir = board_dir(name)
    state = load_state(bdir)
    master = read_pid(bdir / "sshd.pid")
    doomed = [pid for pid in _descendants(master) if _comm(pid) == "sshd"] if master else []
    stop_pidfile(bdir / "sshd.pid")
    for pid in doomed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(down_s)
    start_board_sshd(name, bdir, state)  # back under the board's RAM cap and CPU quota


def restore(name: str, timeout_s: float = 30.0) -> None:
    """Undo every fault of this module: the link up, sshd running; returns once sshd accepts TCP
    connections again (BoardError past ``timeout_s``)."""
    bdir = board_dir(name)
    state = load_state(bdir)
    if state.get("netns"):
        set_link(name, up=True)
    if not sshd_alive(bdir):
        start_board_sshd(name, bdir, state)
    deadline = time.monotonic() + timeout_s
    while not port_open(state["host"], int(state["port"])):
        if time.monotonic() > deadline:
            raise BoardError(
                f"board {name}: sshd does not accept connections {timeout_s:.0f} s after restore"
            )
        time.sleep(0.2)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
