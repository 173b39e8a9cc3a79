"""A CPU quota for a virtual board, enforced by the kernel: a cgroup (v2 ``cpu.max``, else v1
``cpu.cfs_quota_us``) that the board's sshd joins, so every session and job it starts inherits it.
A quota of 0.5 lets the board's processes use half of one CPU in total, however many they are.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from tasks.errors import BoardError

ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
V1_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def _v2_root() -> Path | None:
    for root in ROOTS:
        ctl = root / "cgroup.subtree_control"
        if ctl.is_file() and "cpu" in ctl.read_text().split():
            return root
    return None


def cgroup_dir(name: str) -> Path:
    """Where board ``name``'s cgroup lives (v2 with the cpu controller, else v1's cpu hierarchy)."""
    root = _v2_root()
    if root is not None:
        return root / f"odl-vboard-{name}"
    if (V1_CPU / "cpu.cfs_quota_us").is_file():
        return V1_CPU / f"odl-vboard-{name}"
    raise BoardError(
        "virtual board cpu_quota: no writable cgroup cpu controller (neither cgroup v2 cpu.max nor "
        "v1 /sys/fs/cgroup/cpu); run as root on a host that delegates the cpu controller"
    )


def limit_cpu(name: str, quota: float, pid: int) -> Path:
    """Create board ``name``'s cgroup with ``quota`` CPUs (e.g. 0.25) and move ``pid`` into it."""
    if not 0.01 <= quota <= os.cpu_count():  # type: ignore[operator]
        raise BoardError(f"cpu_quota: expected a number of CPUs in [0.01, {os.cpu_count()}] (got {quota})")
    cg = cgroup_dir(name)
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


def cpu_quota(name: str) -> float | None:
    """The quota board ``name``'s cgroup enforces (CPUs), None without one."""
    with contextlib.suppress(BoardError, OSError):
        cg = cgroup_dir(name)
        if (cg / "cpu.max").is_file():
            q, period = (cg / "cpu.max").read_text().split()
            return None if q == "max" else int(q) / int(period)
        if (cg / "cpu.cfs_quota_us").is_file():
            q = int((cg / "cpu.cfs_quota_us").read_text())
            return None if q < 0 else q / int((cg / "cpu.cfs_period_us").read_text())
    return None


def remove(name: str) -> None:
    """Remove the board's cgroup (its processes must be gone: the kernel refuses a busy one)."""
    with contextlib.suppress(BoardError, OSError):
        cgroup_dir(name).rmdir()
