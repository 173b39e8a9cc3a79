"""The verdicts of ``odl board check``: one :class:`Check` per item, its thresholds, and what to do.

Pure functions of what the probe measured (no SSH here), so they are unit-tested directly.

Thresholds (why):

* python >= 3.10 — the agent uses ``isinstance(x, A | B)`` and ``zip(..., strict=True)``.
* numpy >= 1.16.6 — what onnxruntime-training 1.19.2 declares (``Requires-Dist``).
* onnxruntime == the inventory's ``ort_version`` (the host refuses a board that differs) — and 1.19.2,
  the last ORT training release, the one the host's artifacts are generated and tested with (WARN
  when the inventory names another one, unless the board runs the autograd runtime only and the
  version is one ``deploy/board-requirements-plain.txt`` supports); its training API must load
  without torch, unless the inventory's ``runtimes`` leave out ``"ort-training"`` (an aarch64 board: no
  onnxruntime-training wheel exists there), where its absence is what the entry says.
* agent: protocol == the host's ``PROTOCOL_VERSION`` (FAIL otherwise); not installed is a WARN (the
  next deploy or ``odl board info NAME`` installs it).
* RAM available to a job (MemAvailable, lowered by the headroom of a cgroup memory limit, as the
  agent counts it): FAIL below 128 MB (the runtime alone takes ~50 MB RSS), WARN
  below 768 MB (the reference mobilenet_v2 at batch 16 peaks at ~730 MB).
* free disk at the root: FAIL below 100 MB (the agent refuses to run), WARN below 1 GB.
* disk write (16 MB, fsync) at the root: FAIL below 1 MB/s, WARN below 5 MB/s (a ~10 MB checkpoint
  would stall training for seconds).
* clock skew (board ``date`` vs host time at the middle of the round trip): WARN above 1 s, FAIL
  above 5 s (TLS certificates, logs and schedules go wrong).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from device_agent.protocol import PROTOCOL_VERSION
from tasks.board.inventory import Board
from tasks.errors import BoardError, HostExit
from tasks.paths import PROJECT_ROOT

PASS, WARN, FAIL, SKIPPED = "PASS", "WARN", "FAIL", "SKIPPED"
MIN_PYTHON = (3, 10)
MIN_NUMPY = (1, 16, 6)
ORT_TESTED = "1.19.2"
RAM_FAIL_MB, RAM_WARN_MB = 128.0, 768.0
DISK_FAIL_MB, DISK_WARN_MB = 100.0, 1024.0
WRITE_MB = 16
WRITE_FAIL_MBPS, WRITE_WARN_MBPS = 1.0, 5.0
BOARD_REQUIREMENTS = PROJECT_ROOT / "deploy" / "board-requirements.txt"
PLAIN_REQUIREMENTS = PROJECT_ROOT / "deploy" / "board-requirements-plain.txt"
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)$")
AUTOGRAD_FIX = (
    'or train with [training] runtime = "autograd" and set runtimes = ["autograd"] in the inventory entry'
)

ORT_FIX = (
    "the board needs onnxruntime 1.19.2 with the training API: install X-LINUX-AI's ONNX Runtime "
    "(OpenSTLinux package feed, e.g. apt-get install python3-onnxruntime); no pip wheel exists for "
    "aarch64, and a plain onnxruntime has no training API"
)


@dataclass(frozen=True)
class Check:
    """One line of the report: a named item, its status, what was measured and, unless PASS, what to do."""

    name: str
    status: str
    value: str
    fix: str = ""
    code: int = 0  # the ``odl`` exit code this failure stands for (FAIL only)

    def line(self) -> str:
        """The item as one line of text (a multi-line value or fix is folded onto it)."""
        fix = f" -> fix: {' '.join(self.fix.split())}" if self.fix and self.status != PASS else ""
        return f"{self.status:<7} {self.name:<12} {' '.join(self.value.split())}{fix}"

    def to_dict(self) -> dict[str, Any]:
        """The item for ``--json``."""
        return asdict(self)


def fail(name: str, value: str, fix: str, code: int = HostExit.INCOMPATIBLE) -> Check:
    """A FAIL; by default it stands for DeviceIncompatible's exit code."""
    return Check(name, FAIL, value, fix, int(code))


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string: ``"2.0.0rc1"`` -> ``(2, 0, 0)``."""
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3])


def fmt_mb(mb: float) -> str:
    """A size for people: MB below 10 GB, GB above."""
    return f"{mb / 1024:.1f} GB" if mb >= 10240 else f"{mb:.0f} MB"


def judge_python(sec: dict[str, Any], board: Board) -> Check:
    """The board's python runs and is recent enough for the agent."""
    if "error" in sec:
        return fail("python", sec["error"], f"set python in the inventory entry of {board.name} to the "
                    "board's python3 (X-LINUX-AI: /usr/bin/python3; `command -v python3` on the board)")  # fmt: skip
    value = f"{sec['version']} ({sec['executable']}, {sec['machine']})"
    if version_tuple(sec["version"])[:2] < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return fail("python", f"{value} < {need}", f"the agent needs python >= {need}: point python in the "
                    "inventory at a newer python3, or update OpenSTLinux/X-LINUX-AI on the board")  # fmt: skip
    return Check("python", PASS, value)


def board_pin(package: str) -> str:
    """``package==version`` as deploy/board-requirements.txt pins it (the bare name when it does not)."""
    for line in BOARD_REQUIREMENTS.read_text().splitlines():
        if line.split("==")[0].strip() == package:
            return line.split("#")[0].strip()
    return package


def judge_numpy(sec: dict[str, Any], board: Board) -> Check:
    """numpy imports with the board's python and is recent enough for onnxruntime."""
    fix = (
        f"install numpy for {board.python}: on OpenSTLinux apt-get install python3-numpy (X-LINUX-AI "
        f"feed), elsewhere {board.python} -m pip install {board_pin('numpy')} (deploy/board-requirements.txt)"
    )
    if "error" in sec:
        return fail("numpy", f"not importable: {sec['error']}", fix)
    if version_tuple(sec["version"]) < MIN_NUMPY:
        return fail("numpy", f"{sec['version']} < {'.'.join(map(str, MIN_NUMPY))} (onnxruntime 1.19.2)", fix)
    return Check("numpy", PASS, sec["version"])


def ort_only_plain(board: Board) -> bool:
    """The inventory says the board runs no ORT-training job (its ``runtimes`` leave out ``"ort-training"``)."""
    return bool(board.runtimes) and "ort-training" not in board.runtimes


def pins(path: Path) -> dict[str, list[str]]:
    """``name -> [version, ...]`` of a requirements file's ``name==version`` lines, in order;
    BoardError naming the file and line of any other line."""
    out: dict[str, list[str]] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        if match is None:
            raise BoardError(f"{path}:{number}: expected name==version, got {line!r}")
        out.setdefault(match.group(1).lower(), []).append(match.group(2))
    return out


def plain_versions() -> list[str]:
    """The plain onnxruntime versions deploy/board-requirements-plain.txt supports (the autograd runtime)."""
    return pins(PLAIN_REQUIREMENTS).get("onnxruntime", [])


def judge_ort(sec: dict[str, Any], board: Board) -> Check:
    """onnxruntime imports and its version is the inventory's (and the tested 1.19.2)."""
    if "error" in sec:
        return fail("onnxruntime", f"not importable: {sec['error']}", ORT_FIX)
    got = sec["version"]
    if got != board.ort_version:
        value = f"{got}, inventory expects ort_version = {board.ort_version}"
        entry = f'set ort_version = "{got}" in the inventory entry of {board.name}'
        if got == ORT_TESTED:  # the board is right, the inventory is not
            return fail("onnxruntime", value, f"{entry} (the host refuses a board whose ORT differs from it)")
        return fail("onnxruntime", value, f"{ORT_FIX}; or, if {got} is intended, {entry}")
    if ort_only_plain(board) and got in plain_versions():
        return Check("onnxruntime", PASS, f"{got} (= inventory ort_version; plain build, autograd runtime)")
    if got != ORT_TESTED:
        return Check("onnxruntime", WARN, f"{got} (as the inventory says), but artifacts are made and tested "
                     f"with {ORT_TESTED}", ORT_FIX)  # fmt: skip
    return Check("onnxruntime", PASS, f"{got} (= inventory ort_version)")


def judge_training_api(sec: dict[str, Any], board: Board) -> Check:
    """``onnxruntime.training.api`` loads without torch (device_agent.ort.training_api_status)."""
    if "error" in sec:
        return Check("training-api", SKIPPED, "onnxruntime does not import")
    if not sec.get("training_api"):
        if ort_only_plain(board):
            return Check("training-api", PASS, f"absent, as the inventory says (runtimes = {', '.join(board.runtimes)}):"
                         " ORT-training jobs are refused here")  # fmt: skip
        return fail(
            "training-api", sec.get("training_api_error") or "not importable", f"{ORT_FIX}; {AUTOGRAD_FIX}"
        )
    torch = "; torch was imported" if sec.get("torch_loaded") else " (torch-free)"
    return Check("training-api", PASS, f"onnxruntime.training.api loads{torch}")


def judge_agent(sec: dict[str, Any], board: Board, host_hash: str) -> Check:
    """The installed agent speaks the host's protocol; not installed is a WARN saying how to install it."""
    install = f"odl board info {board.name} installs the host's agent (every deploy does too)"
    if "error" in sec:
        return Check("agent", WARN, f"cannot read the installed agent: {sec['error']}", install)
    if not sec.get("installed"):
        return Check("agent", WARN, f"not installed under {board.root}/agent", install)
    proto, version = sec.get("protocol_version"), sec.get("agent_version")
    if proto != PROTOCOL_VERSION:
        return fail("agent", f"agent {version} speaks protocol {proto}, the host speaks {PROTOCOL_VERSION}",
                    f"{install}; if another host drives this board with an older pipeline, upgrade it too")  # fmt: skip
    same = (
        "same build as the host"
        if sec.get("hash") == host_hash
        else "another build: the next deploy replaces it"
    )
    return Check("agent", PASS, f"agent {version}, protocol {proto} ({same})")


def available_ram(sec: dict[str, Any]) -> tuple[float, str]:
    """The RAM a job can use in MB and where that figure comes from."""
    avail, why = sec["available_mb"], f"MemAvailable of {fmt_mb(sec['total_mb'])}"
    cg = sec.get("cgroup")
    if cg and cg["headroom_mb"] < avail:
        avail = cg["headroom_mb"]
        why = f"cgroup limit {fmt_mb(cg['limit_mb'])}, {fmt_mb(cg['usage_mb'])} used ({cg['path']})"
    return avail, why


def judge_ram(sec: dict[str, Any], board: Board) -> Check:
    """Enough free RAM for a job: FAIL below RAM_FAIL_MB, WARN below RAM_WARN_MB."""
    if "error" in sec:
        return fail("ram", sec["error"], "check /proc/meminfo on the board")
    avail, why = available_ram(sec)
    value = f"{fmt_mb(avail)} available ({why})"
    free_it = "free RAM on the board (stop services you do not need, e.g. the demo GUI; see top)"
    if avail < RAM_FAIL_MB:
        return fail(
            "ram", f"{value} < {RAM_FAIL_MB:.0f} MB", f"{free_it}, or raise the cgroup's memory limit"
        )
    if avail < RAM_WARN_MB:
        return Check("ram", WARN, f"{value} < {RAM_WARN_MB:.0f} MB", f"only small models or batches fit (mobilenet_v2 "
                     f"at batch 16 peaks at ~730 MB): lower the recipe's batch size, or {free_it}")  # fmt: skip
    return Check("ram", PASS, value)


def judge_disk(sec: dict[str, Any], board: Board) -> Check:
    """The root exists or can be created, is writable and has free space."""
    owned = f"set root in the inventory entry to a folder {board.user or 'the board user'} owns (e.g. ~/odl)"
    if sec.get("error") and "free_mb" not in sec:
        return fail("disk", sec["error"], "check the board's filesystems (df, dmesg)")
    if sec.get("error") or not sec.get("writable"):
        return fail("disk", f"cannot write {sec['root']}: {sec.get('error') or 'permission denied'}", owned)
    value = f"{fmt_mb(sec['free_mb'])} free of {fmt_mb(sec['total_mb'])} at {sec['root']}"
    cleanup = f"free space on the board: old jobs ({board.root}/jobs/JOB), unused blobs, other files"
    if sec["free_mb"] < DISK_FAIL_MB:
        return fail(
            "disk", f"{value} < {DISK_FAIL_MB:.0f} MB", f"{cleanup}; the agent refuses to run below 100 MB"
        )
    if sec["free_mb"] < DISK_WARN_MB:
        return Check(
            "disk", WARN, f"{value} < {fmt_mb(DISK_WARN_MB)}", f"{cleanup}; checkpoints and data need room"
        )
    return Check("disk", PASS, value + (" (created)" if sec.get("created") else ""))


def judge_write(sec: dict[str, Any], board: Board) -> Check:
    """Write speed at the root (write + fsync): FAIL below WRITE_FAIL_MBPS, WARN below WRITE_WARN_MBPS."""
    if "skipped" in sec:
        return Check("disk-write", SKIPPED, sec["skipped"])
    if "error" in sec:
        return fail("disk-write", f"writing {WRITE_MB} MB under {board.root} failed: {sec['error']}",
                    "check the board's storage (dmesg; a read-only remount means a failing card)")  # fmt: skip
    speed = sec["mb"] / max(sec["seconds"], 1e-6)
    value = f"{speed:.1f} MB/s ({sec['mb']} MB written + fsync in {sec['seconds']:.2f} s, deleted)"
    fix = ("slow storage stalls checkpoints and uploads: put root on the eMMC or a faster SD card "
           "(UHS-I, A1), and look for I/O errors in dmesg")  # fmt: skip
    if speed < WRITE_FAIL_MBPS:
        return fail("disk-write", f"{value} < {WRITE_FAIL_MBPS:.0f} MB/s", fix)
    if speed < WRITE_WARN_MBPS:
        return Check("disk-write", WARN, f"{value} < {WRITE_WARN_MBPS:.0f} MB/s", fix)
    return Check("disk-write", PASS, value)
