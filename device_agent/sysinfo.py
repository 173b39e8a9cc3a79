"""What the board has: RAM, disk, CPU, versions (for ``info`` and the guards)."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import sys
from pathlib import Path

from device_agent.protocol import AGENT_VERSION, PROTOCOL_VERSION, VERSION_KEY, BoardInfo

FAKE_MEM_ENV = "ODL_AGENT_FAKE_MEM_MB"


def meminfo_mb() -> dict[str, float]:
    """Total and available RAM in MB from /proc/meminfo (MemAvailable), env override for tests.

    ``ODL_AGENT_FAKE_MEM_MB`` replaces the available figure (tests, the virtual board's RAM cap).
    """
    values: dict[str, float] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                values[key] = float(rest.split()[0]) / 1024.0
    except OSError:
        pass
    total = values.get("MemTotal", 0.0)
    avail = values.get("MemAvailable", values.get("MemFree", 0.0))
    fake = os.environ.get(FAKE_MEM_ENV)
    if fake:
        avail = float(fake)
        total = max(total, avail)
    return {"total_mb": round(total, 1), "available_mb": round(avail, 1)}


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
    """Agent, protocol, Python, numpy and ORT versions (ORT imported torch-free)."""
    import numpy

    from device_agent.ort import load_onnxruntime

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
    }


def board_info(root: Path) -> BoardInfo:
    """The ``info`` answer: versions, training API status, RAM, disk, CPUs, machine."""
    from device_agent.ort import training_api_status

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
        disk_free_mb=free_disk_mb(root),
        root=str(root),
        cpu_count=os.cpu_count() or 1,
        machine=platform.machine(),
        torch_loaded=bool(sys.modules.get("torch")),
    )
