"""``odl board check NAME``: is this board ready to train? One line per item, each PASS, WARN, FAIL
or SKIPPED with what was measured and, unless PASS, what to do.

Items, in order (thresholds and their reasons in :mod:`tasks.board.check_items`)::

    ssh          reachable with the inventory's key; host key pinned / unknown / CHANGED
    python       the board's python runs, version >= 3.10               (needs ssh)
    numpy        imports, version                                      (needs python)
    onnxruntime  version == inventory ort_version (and 1.19.2)         (needs numpy)
    training-api onnxruntime.training.api loads without torch          (needs numpy)
    agent        installed agent's protocol == host's PROTOCOL_VERSION (needs python)
    ram          MemAvailable, cgroup memory limit                     (needs python)
    disk         free space at the root, root writable                 (needs python)
    disk-write   16 MB write + fsync at the root, MB/s                 (needs disk)
    clock        board `date` vs host time, half round trip corrected  (needs ssh)

An item whose prerequisite FAILed (or was SKIPPED) is SKIPPED with the reason. It costs three
round trips after the connection: three ``date`` calls (the shortest round trip is kept) and one
python program (:mod:`tasks.board.check_probe`) that measures everything else. The exit status is
0 without a FAIL, else the ``odl`` exit code of the first FAIL (60 host key, 59 unreachable, 61
for anything the board lacks).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import device_agent.ort
from tasks.board import check_probe
from tasks.board.agent import agent_hash
from tasks.board.check_clock import clock_skew, judge_clock, parse_date
from tasks.board.check_items import (
    FAIL,
    SKIPPED,
    WRITE_MB,
    Check,
    fail,
    judge_agent,
    judge_disk,
    judge_numpy,
    judge_ort,
    judge_python,
    judge_ram,
    judge_training_api,
    judge_write,
)
from tasks.board.check_ssh import open_link
from tasks.board.inventory import Board
from tasks.board.transport import Transport
from tasks.errors import DeviceError, HostExit

PROBE_TIMEOUT_S = 120.0
CLOCK_SAMPLES = 3
Judge = Callable[[dict[str, Any], Board], Check]


def _agent(sec: dict[str, Any], board: Board) -> Check:
    return judge_agent(sec, board, agent_hash())


# (item, probe section, the item it needs, verdict)
ITEMS: list[tuple[str, str, str, Judge]] = [
    ("python", "python", "ssh", judge_python),
    ("numpy", "numpy", "python", judge_numpy),
    ("onnxruntime", "ort", "numpy", judge_ort),
    ("training-api", "ort", "numpy", judge_training_api),
    ("agent", "agent", "python", _agent),
    ("ram", "mem", "python", judge_ram),
    ("disk", "disk", "python", judge_disk),
    ("disk-write", "write", "disk", judge_write),
]


def probe_argv(board: Board) -> list[str]:
    """The argv that runs the probe with the board's python (its stdin: device_agent/ort.py)."""
    source = Path(check_probe.__file__).read_text()
    return ["env", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1", board.python, "-c", source,
            board.root, str(WRITE_MB)]  # fmt: skip


def run_probe(conn: Transport, board: Board) -> dict[str, dict[str, Any]]:
    """Every section the probe printed; a section it never reached holds an ``error`` saying why."""
    ort_source = Path(device_agent.ort.__file__).read_bytes()
    try:
        res = conn.run(probe_argv(board), input=ort_source, check=False, timeout=PROBE_TIMEOUT_S)
    except DeviceError as exc:
        return {"python": {"error": f"the probe did not finish: {exc}"}}
    sections: dict[str, dict[str, Any]] = {}
    for line in res.stdout.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("section"), str):
            sections[obj.pop("section")] = obj
    tail = " ".join((res.stderr or res.stdout).strip().splitlines()[-3:])[-400:]
    if "python" not in sections:
        what = "not found on the board" if res.code == 127 else "did not run"
        return {"python": {"error": f"{board.python} {what} (exit {res.code}): {tail}"}}
    died = {"error": f"the probe stopped before this (exit {res.code}): {tail}"}
    for name in ("agent", "mem", "disk", "write", "numpy"):
        sections.setdefault(name, died)
    if "error" not in sections["numpy"]:
        sections.setdefault("ort", died)
    return sections


def measure_clock(conn: Transport) -> Check:
    """The clock item: the board's ``date +%s.%N`` against the host's time, best of a few round trips."""
    samples = []
    try:
        for _ in range(CLOCK_SAMPLES):
            sent = time.time()
            res = conn.run(["date", "+%s.%N"], timeout=30)
            received = time.time()
            samples.append(clock_skew(sent, received, *parse_date(res.stdout)))
    except (DeviceError, ValueError) as exc:
        code = exc.exit_code if isinstance(exc, DeviceError) else HostExit.DEVICE
        return fail(
            "clock", f"cannot read the board's clock: {exc}", "check that `date` runs on the board", code
        )
    return judge_clock(*min(samples, key=lambda s: s[1]))


def _skipped(name: str, blocker: Check) -> Check:
    why = "failed" if blocker.status == FAIL else "was skipped"
    return Check(name, SKIPPED, f"needs {blocker.name}, which {why}")


def check_board(board: Board) -> list[Check]:
    """Run every item against ``board``, in order; never raises for a board problem."""
    conn, ssh = open_link(board)
    checks = {"ssh": ssh}
    sections: dict[str, dict[str, Any]] = {}
    clock = None
    if conn is not None:
        with conn:
            clock = measure_clock(conn)
            sections = run_probe(conn, board)
    for name, section, needs, judge in ITEMS:
        blocker = checks[needs]
        if blocker.status in (FAIL, SKIPPED):
            checks[name] = _skipped(name, blocker)
        else:
            checks[name] = judge(sections.get(section, {"error": "no answer from the probe"}), board)
    checks["clock"] = clock if clock is not None else _skipped("clock", ssh)
    return list(checks.values())


def exit_code(checks: list[Check]) -> int:
    """0 without a FAIL, else the exit code of the first FAIL (one of HostExit's device codes)."""
    return next((c.code or int(HostExit.DEVICE) for c in checks if c.status == FAIL), 0)


def report(board: Board, checks: list[Check], seconds: float) -> str:
    """The text report: one line per item, then a summary line."""
    counts = {s: sum(c.status == s for c in checks) for s in ("PASS", "WARN", "FAIL", "SKIPPED")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    where = f"{board.user}@{board.host}:{board.port}" if board.transport == "ssh" else "local"
    return "\n".join(
        [*(c.line() for c in checks), f"board {board.name} ({where}): {summary} in {seconds:.1f} s"]
    )


def print_check(board: Board, as_json: bool = False) -> int:
    """Check ``board``, print the report (or a JSON list of the items) and return the exit status."""
    start = time.monotonic()
    checks = check_board(board)
    if as_json:
        print(json.dumps([c.to_dict() for c in checks], indent=2))
    else:
        print(report(board, checks, time.monotonic() - start))
    return exit_code(checks)
