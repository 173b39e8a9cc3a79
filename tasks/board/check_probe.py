"""The board side of ``odl board check``: one small program run as ``PYTHON -c SOURCE ROOT WRITE_MB``.

It runs with the board's own python, before anything is installed, so it uses the standard library
only, carries no type hints and no modern syntax (an old python must still get far enough to say
its version), and never imports torch. It prints one JSON line per section as soon as that section
is measured — ``python``, ``agent``, ``mem``, ``disk``, ``write``, ``numpy``, ``ort`` — so a crash in a
late, risky section (loading onnxruntime) still leaves the earlier answers. ``ort`` is skipped when
numpy does not import (onnxruntime needs it).

stdin holds the source of the host's ``device_agent/ort.py``: the training API is probed with the
agent's own torch-free loader (``training_api_status``), whether or not an agent is installed.

The host imports this module too, for its pure parsers (``meminfo``, ``cgroup_memory``).
"""

import json
import os
import platform
import re
import shutil
import sys
import time
import types

MB = 1024 * 1024
UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a huge page-aligned number


def emit(section, data):
    """Print one section as a JSON line, at once."""
    data = dict(data, section=section)
    sys.stdout.write(json.dumps(data, sort_keys=True) + "\n")
    sys.stdout.flush()


def python_section():
    """Version, interpreter and machine."""
    return {"version": platform.python_version(), "executable": sys.executable, "machine": platform.machine()}


def agent_section(root):
    """The installed agent's protocol and agent versions (read, not imported) and its install stamp."""
    agent = os.path.join(root, "agent")
    try:
        with open(os.path.join(agent, "device_agent", "protocol.py")) as fh:
            text = fh.read()
    except OSError:
        return {"installed": False}
    try:  # newer agents define the wire constants (PROTOCOL_VERSION) in wire.py
        with open(os.path.join(agent, "device_agent", "wire.py")) as fh:
            text += "\n" + fh.read()
    except OSError:
        pass
    proto = re.search(r"^PROTOCOL_VERSION\s*=\s*(\d+)", text, re.M)
    version = re.search(r"^AGENT_VERSION\s*=\s*[\"']([^\"']+)", text, re.M)
    try:
        with open(os.path.join(agent, ".agent-hash")) as fh:
            stamp = fh.read().strip()
    except OSError:
        stamp = ""
    return {
        "installed": True,
        "protocol_version": int(proto.group(1)) if proto else None,
        "agent_version": version.group(1) if version else None,
        "hash": stamp,
    }


def meminfo(text):
    """MemTotal and MemAvailable (MemFree on old kernels) in MB from /proc/meminfo's text."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if rest.split():
            values[key] = float(rest.split()[0]) / 1024.0
    return {
        "total_mb": values.get("MemTotal", 0.0),
        "available_mb": values.get("MemAvailable", values.get("MemFree", 0.0)),
    }


def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _reclaimable(folder):
    """Bytes of inactive page cache in a cgroup (the kernel drops it before it kills anything)."""
    for line in (_read(os.path.join(folder, "memory.stat")) or "").splitlines():
        key, _, value = line.partition(" ")
        if key in ("inactive_file", "total_inactive_file") and value.strip().isdigit():
            return int(value)
    return 0


def _level(folder, limit_file, usage_file):
    limit, usage = _read(os.path.join(folder, limit_file)), _read(os.path.join(folder, usage_file))
    if not (limit and limit.isdigit() and int(limit) < UNLIMITED and usage and usage.isdigit()):
        return None
    used = max(int(usage) - _reclaimable(folder), 0)
    return {"limit_mb": int(limit) / MB, "usage_mb": used / MB, "headroom_mb": (int(limit) - used) / MB,
            "path": folder}  # fmt: skip


def cgroup_memory(proc_cgroup, fs="/sys/fs/cgroup"):
    """The tightest memory limit of this process's cgroup and its ancestors (v2 or v1), or None.

    Returns ``{"limit_mb", "usage_mb", "headroom_mb", "path"}`` of the level with the least headroom;
    usage leaves out inactive page cache. A board whose cgroup filesystem is not mounted where the
    process runs (e.g. inside ``ip netns exec``) shows no limit.
    """
    levels = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            levels.append((fs, parts[2], "memory.max", "memory.current"))
        elif "memory" in parts[1].split(","):
            levels.append(
                (os.path.join(fs, "memory"), parts[2], "memory.limit_in_bytes", "memory.usage_in_bytes")
            )
    best = None
    for base, rel, limit_file, usage_file in levels:
        rel = rel.strip("/")
        while True:
            level = _level(os.path.join(base, rel) if rel else base, limit_file, usage_file)
            if level and (best is None or level["headroom_mb"] < best["headroom_mb"]):
                best = level
            if not rel:
                break
            rel = os.path.dirname(rel)
    return best


def mem_section():
    """RAM: /proc/meminfo and the cgroup limit."""
    out = meminfo(_read("/proc/meminfo") or "")
    out["cgroup"] = cgroup_memory(_read("/proc/self/cgroup") or "")
    return out


def disk_section(root):
    """Free disk at the agent root (created when missing, as the agent would) and whether it is writable."""
    out = {"root": root, "created": False, "error": None}
    if not os.path.isdir(root):
        try:
            os.makedirs(root, mode=0o750)
            out["created"] = True
        except OSError as exc:
            out["error"] = str(exc)
    path = root
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    usage = shutil.disk_usage(path)
    out.update(
        path=path, free_mb=usage.free / MB, total_mb=usage.total / MB, writable=os.access(path, os.W_OK)
    )
    return out


def write_section(root, size_mb, disk):
    """Write ``size_mb`` MB under the root, fsync, delete; the seconds it took.

    Skipped when the root is not writable, or when the write would leave less than 64 MB free.
    """
    if disk.get("error") or not disk.get("writable"):
        return {"skipped": "the root is not writable"}
    if disk.get("free_mb", 0.0) < size_mb + 64:
        return {"skipped": f"only {disk.get('free_mb', 0.0):.0f} MB free"}
    path = os.path.join(root, ".odl-check-" + str(os.getpid()) + ".tmp")
    block = os.urandom(MB)
    start = time.monotonic()
    try:
        with open(path, "wb", buffering=0) as fh:
            for _ in range(size_mb):
                fh.write(block)
            os.fsync(fh.fileno())
        seconds = time.monotonic() - start
    except OSError as exc:
        return {"error": str(exc), "path": path}
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return {"mb": size_mb, "seconds": seconds, "path": path}


def numpy_section():
    """numpy's version, or why it does not import."""
    try:
        import numpy  # the board may lack numpy: this section says so
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return {"error": type(exc).__name__ + ": " + str(exc)}
    return {"version": numpy.__version__, "file": numpy.__file__}


def ort_section(ort_source):
    """onnxruntime's version and the training API status, through the agent's torch-free loader."""
    loader = types.ModuleType("odl_check_ort")
    exec(compile(ort_source, "device_agent/ort.py", "exec"), loader.__dict__)
    try:
        ort = loader.load_onnxruntime()
    except Exception as exc:  # noqa: BLE001
        return {"error": type(exc).__name__ + ": " + str(exc)}
    ok, err = loader.training_api_status()
    return {"version": str(ort.__version__), "file": ort.__file__, "training_api": ok,
            "training_api_error": err, "torch_loaded": bool(sys.modules.get("torch"))}  # fmt: skip


def main(argv):
    """Run every section in order; a failing section reports its error and the next one runs."""
    root, size_mb, ort_source = argv[1], int(argv[2]), sys.stdin.read()
    done = {}
    steps = [("python", python_section), ("agent", lambda: agent_section(root)), ("mem", mem_section),
             ("disk", lambda: disk_section(root)), ("write", lambda: write_section(root, size_mb, done["disk"])),
             ("numpy", numpy_section), ("ort", lambda: ort_section(ort_source))]  # fmt: skip
    for name, step in steps:
        if name == "ort" and "error" in done["numpy"]:
            continue  # onnxruntime imports numpy: its error would only repeat numpy's
        try:
            done[name] = step()
        except Exception as exc:  # noqa: BLE001 - report and go on
            done[name] = {"error": type(exc).__name__ + ": " + str(exc)}
        emit(name, done[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
