"""Kernel-enforced limits of a virtual board: a CPU quota and a RAM cap, in a cgroup that the
board's sshd joins, so every session and job it starts inherits them.

* CPU: cgroup v2 ``cpu.max`` if the cpu controller is delegated, else v1 ``cpu.cfs_quota_us``
  under ``/sys/fs/cgroup/cpu/odl-vboard-NAME``. A quota of 0.5 lets the board's processes use half
  of one CPU in total, however many they are.
* RAM: v2 ``memory.max`` with ``memory.swap.max`` = 0, else v1 ``memory.limit_in_bytes`` under
  ``/sys/fs/cgroup/memory/odl-vboard-NAME`` with ``memory.memsw.limit_in_bytes`` equal to it (when the
  kernel accounts swap) and ``memory.swappiness`` 0, so swap never hides the cap: a process that
  needs more than the cap is killed by the kernel's OOM killer (SIGKILL), as on a board that has
  no more RAM. The cgroups sit at the root of their hierarchy (they outlive the process that made
  them, like the board), and ``board_down`` removes them once the board's processes are gone.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from tasks.errors import BoardError
from tasks.vboard.owner import machine_name

ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
V1 = {"cpu": Path("/sys/fs/cgroup/cpu"), "memory": Path("/sys/fs/cgroup/memory")}
V1_PROBE = {"cpu": "cpu.cfs_quota_us", "memory": "memory.limit_in_bytes"}
PERIOD_US = 100_000
MIN_MEM_MB = 32


def _v2_root(controller: str) -> Path | None:
    for root in ROOTS:
        ctl = root / "cgroup.subtree_control"
        if ctl.is_file() and controller in ctl.read_text().split():
            return root
    return None


def cgroup_dir(name: str, controller: str = "cpu", kind: str = "vboard") -> Path:
    """Where board ``name``'s cgroup for ``controller`` (cpu or memory) lives: v2, else v1
    (``kind`` "host": a simulated worker host's, :mod:`tasks.hosts`)."""
    root = _v2_root(controller)
    if root is not None:
        return root / f"odl-{kind}-{machine_name(name)}"
    if (V1[controller] / V1_PROBE[controller]).is_file():
        return V1[controller] / f"odl-{kind}-{machine_name(name)}"
    raise BoardError(
        f"virtual board: no writable cgroup {controller} controller (neither cgroup v2 nor v1 "
        f"{V1[controller]}); run as root on a host that delegates the {controller} controller"
    )


def limit_cpu(name: str, quota: float, pid: int, kind: str = "vboard") -> Path:
    """Create board ``name``'s cgroup with ``quota`` CPUs (e.g. 0.25) and move ``pid`` into it."""
    if not 0.01 <= quota <= os.cpu_count():  # type: ignore[operator]
        raise BoardError(f"cpu_quota: expected a number of CPUs in [0.01, {os.cpu_count()}] (got {quota})")
    cg = cgroup_dir(name, "cpu", kind)
    try:
        cg.mkdir(exist_ok=True)
        quota_us = max(1000, int(quota * PERIOD_US))
        if (cg / "cpu.max").exists():
            (cg / "cpu.max").write_text(f"{quota_us} {PERIOD_US}\n")
        else:
            (cg / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (cg / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
        (cg / "cgroup.procs").write_text(f"{pid}\n")
    except OSError as exc:
        raise BoardError(f"virtual board {name}: cannot set its CPU quota in {cg}: {exc}") from exc
    return cg


def limit_memory(name: str, mem_mb: int, pid: int) -> Path:
    """Create board ``name``'s memory cgroup capped at ``mem_mb`` MB (no swap) and move ``pid`` in."""
    if not MIN_MEM_MB <= mem_mb:
        raise BoardError(f"mem_mb: expected at least {MIN_MEM_MB} MB of RAM for a board (got {mem_mb})")
    cg = cgroup_dir(name, "memory")
    limit = int(mem_mb) * 2**20
    try:
        cg.mkdir(exist_ok=True)
        if (cg / "memory.max").exists():  # v2
            (cg / "memory.max").write_text(f"{limit}\n")
            if (cg / "memory.swap.max").exists():
                (cg / "memory.swap.max").write_text("0\n")
        else:  # v1: memsw must stay >= the limit, so lift it first, then set both
            memsw = cg / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text("-1\n")
            (cg / "memory.limit_in_bytes").write_text(f"{limit}\n")
            if memsw.exists():
                memsw.write_text(f"{limit}\n")
            (cg / "memory.swappiness").write_text("0\n")
        (cg / "cgroup.procs").write_text(f"{pid}\n")
    except OSError as exc:
        raise BoardError(f"virtual board {name}: cannot cap its RAM in {cg}: {exc}") from exc
    return cg


def join(name: str, state: dict, pid: int) -> None:
    """Apply the limits ``state`` names (``cpu_quota``, ``mem_mb``) to ``pid`` (the board's sshd)."""
    if state.get("cpu_quota"):
        limit_cpu(name, float(state["cpu_quota"]), pid)
    if state.get("mem_mb"):
        limit_memory(name, int(state["mem_mb"]), pid)


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text().strip()
    return None


def cpu_quota(name: str, kind: str = "vboard") -> float | None:
    """The quota board ``name``'s cgroup enforces (CPUs), None without one."""
    with contextlib.suppress(BoardError, OSError, ValueError):
        cg = cgroup_dir(name, "cpu", kind)
        if (cg / "cpu.max").is_file():
            q, period = (cg / "cpu.max").read_text().split()
            return None if q == "max" else int(q) / int(period)
        if (cg / "cpu.cfs_quota_us").is_file():
            q = int((cg / "cpu.cfs_quota_us").read_text())
            return None if q < 0 else q / int((cg / "cpu.cfs_period_us").read_text())
    return None


def memory(name: str) -> dict[str, float] | None:
    """Board ``name``'s RAM cap, usage, peak (MB) and OOM kills so far; None without a cap."""
    with contextlib.suppress(BoardError, ValueError):
        cg = cgroup_dir(name, "memory")
        v2 = (cg / "memory.max").exists()
        files = ("memory.max", "memory.current", "memory.peak") if v2 else \
            ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes")  # fmt: skip
        limit, usage, peak = (_read(cg / f) for f in files)
        if not limit or not limit.isdigit() or int(limit) >= 1 << 60:
            return None
        events = _read(cg / ("memory.events" if v2 else "memory.oom_control")) or ""
        kills = dict(line.split() for line in events.splitlines() if len(line.split()) == 2)
        mb = 2**20
        return {"limit_mb": int(limit) / mb, "usage_mb": int(usage or 0) / mb,
                "peak_mb": int(peak or 0) / mb if (peak or "").isdigit() else None,
                "oom_kills": int(kills.get("oom_kill", 0))}  # fmt: skip
    return None


def remove(name: str, wait_s: float = 2.0, kind: str = "vboard") -> None:
    """Remove the board's cgroups once its processes are gone (the kernel refuses a busy one; a
    process just killed may take a moment to leave), waiting up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    for controller in ("cpu", "memory"):
        with contextlib.suppress(BoardError):
            cg = cgroup_dir(name, controller, kind)
            while cg.exists():
                try:
                    cg.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
