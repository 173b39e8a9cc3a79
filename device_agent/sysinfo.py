"""What the board has: RAM, disk, CPU, versions (for ``info`` and the guards)."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import shutil
import sys
from pathlib import Path
from typing import Any

from device_agent.ort import load_onnxruntime, training_api_status
from device_agent.protocol import AGENT_VERSION, PROTOCOL_VERSION, VERSION_KEY, BoardInfo

CGROUP_FS = "/sys/fs/cgroup"
UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a huge page-aligned number


def meminfo_mb() -> dict[str, Any]:
    """The RAM the kernel lets this process have, in MB: ``total_mb``, ``available_mb``, ``limit_mb``.

    ``available_mb`` is the smaller of /proc/meminfo's MemAvailable and the headroom of the tightest
    cgroup memory limit over this process's cgroup and its ancestors (limit - usage, inactive page
    cache counted as free as MemAvailable does). ``limit_mb`` is that cgroup's limit (None when no
    cgroup limits memory, as on a board that runs the agent under no cap) and ``total_mb`` is
    MemTotal, or the limit when it is lower.
    """
    values: dict[str, float] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if rest.split():
                    values[key] = float(rest.split()[0]) / 1024.0
    except OSError:
        pass
    total = values.get("MemTotal", 0.0)
    avail = values.get("MemAvailable", values.get("MemFree", 0.0))
    limit = None
    cap = cgroup_memory_mb()
    if cap is not None:
        limit, headroom = cap
        avail, total = min(avail, headroom), min(total, limit) if total else limit
    return {
        "total_mb": round(total, 1),
        "available_mb": round(max(avail, 0.0), 1),
        "limit_mb": None if limit is None else round(limit, 1),
    }


def cgroup_memory_mb(
    proc_cgroup: str = "/proc/self/cgroup", fs: str = CGROUP_FS
) -> tuple[float, float] | None:
    """``(limit, headroom)`` in MB of the tightest memory limit over this process's cgroups (v2
    ``memory.max``/``memory.current``, v1 ``memory.limit_in_bytes``/``memory.usage_in_bytes``) and
    their ancestors; None when none is limited or the cgroup files cannot be read."""
    try:
        with open(proc_cgroup) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    v2_root = fs if os.path.exists(os.path.join(fs, "cgroup.controllers")) else os.path.join(fs, "unified")
    levels = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            levels.append((v2_root, parts[2], "memory.max", "memory.current", "inactive_file"))
        elif "memory" in parts[1].split(","):
            levels.append((os.path.join(fs, "memory"), parts[2], "memory.limit_in_bytes",
                           "memory.usage_in_bytes", "total_inactive_file"))  # fmt: skip
    best: tuple[float, float] | None = None
    for base, rel, limit_file, usage_file, cache_key in levels:
        rel = rel.strip("/")
        while True:
            level = _cgroup_level(os.path.join(base, rel), limit_file, usage_file, cache_key)
            if level and (best is None or level[1] < best[1]):
                best = level
            if not rel:
                break
            rel = os.path.dirname(rel)
    return best


def _cgroup_level(
    folder: str, limit_file: str, usage_file: str, cache_key: str
) -> tuple[float, float] | None:
    try:
        with open(os.path.join(folder, limit_file)) as fh:
            limit = fh.read().strip()
        with open(os.path.join(folder, usage_file)) as fh:
            usage = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    if not limit.isdigit() or int(limit) >= UNLIMITED:
        return None
    cache = 0
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(folder, "memory.stat")) as fh:
            for line in fh:
                key, _, val = line.partition(" ")
                if key == cache_key:
                    cache = int(val)
    used = max(usage - cache, 0)
    return int(limit) / 2**20, (int(limit) - used) / 2**20


def free_disk_mb(path: Path) -> float:
    """Free disk space in MB on the filesystem holding ``path`` (or its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return round(shutil.disk_usage(path).free / 2**20, 1)


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (VmHWM: unlike ru_maxrss, it resets at exec)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(float(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def versions() -> dict[str, str]:
    """Agent, protocol, Python, numpy and ORT versions (ORT imported torch-free) and the machine
    (``platform.machine()``: aarch64 on an STM32MP2 board); a job's result carries them."""
    import numpy  # lazy: only info and a job's result report it; status, blobs... load no numpy

    try:
        ort_version = str(load_onnxruntime().__version__)
    except ImportError as exc:  # no onnxruntime at all: info must still answer (training_api false)
        ort_version = f"missing ({exc})"
    return {
        "agent": AGENT_VERSION,
        VERSION_KEY: str(PROTOCOL_VERSION),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "onnxruntime": ort_version,
        "machine": platform.machine(),
    }


def board_info(root: Path) -> BoardInfo:
    """The ``info`` answer: versions, training API status, RAM, disk, CPUs, machine."""
    ok, err = training_api_status()
    vers = versions()
    mem = meminfo_mb()
    return BoardInfo(
        protocol_version=PROTOCOL_VERSION,
        agent_version=AGENT_VERSION,
        python_version=vers["python"],
        numpy_version=vers["numpy"],
        ort_version=vers["onnxruntime"],
        training_api=ok,
        training_api_error=err,
        mem_total_mb=mem["total_mb"],
        mem_available_mb=mem["available_mb"],
        mem_limit_mb=mem["limit_mb"],
        disk_free_mb=free_disk_mb(root),
        root=str(root),
        cpu_count=os.cpu_count() or 1,
        machine=platform.machine(),
        torch_loaded=bool(sys.modules.get("torch")),
    )
