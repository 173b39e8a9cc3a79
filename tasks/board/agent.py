"""The device agent on a board: install it when its content hash changed, ask its ``info``, refuse
a board that cannot run a job (protocol, ORT version, training API, RAM, disk)."""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import secrets
from pathlib import Path
from typing import Any

import device_agent
from device_agent.protocol import PROTOCOL_VERSION
from tasks.board.inventory import Board
from tasks.board.transport import Transport
from tasks.errors import DeviceIncompatible

log = logging.getLogger(__name__)

AGENT_SRC = Path(device_agent.__file__).resolve().parent


def agent_hash() -> str:
    """Content hash of the host's ``device_agent`` package (path + bytes of every .py file)."""
    digest = hashlib.sha256()
    for path in sorted(AGENT_SRC.rglob("*.py")):
        digest.update(path.relative_to(AGENT_SRC).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def agent_argv(board: Board, *args: str) -> list[str]:
    """The argv that runs the installed agent on ``board`` with ``args``."""
    agent_dir = posixpath.join(board.root, "agent")
    return [
        "env",
        f"PYTHONPATH={agent_dir}",
        "PYTHONUNBUFFERED=1",
        board.python,
        "-m",
        "device_agent",
        "--root",
        board.root,
        *args,
    ]


def install_agent(conn: Transport, board: Board, memory_estimate_mb: float = 0.0) -> dict[str, Any]:
    """Install the agent when its hash differs, then check ``info``; DeviceIncompatible on mismatch."""
    want = agent_hash()
    stamp = posixpath.join(board.root, "agent", ".agent-hash")
    have = conn.run(["cat", stamp], check=False).stdout.strip()
    if have != want:
        _upload_agent(conn, board, want)
    info = agent_info(conn, board)
    check_info(board, info, memory_estimate_mb)
    return info


def _upload_agent(conn: Transport, board: Board, digest: str) -> None:
    agent_dir = posixpath.join(board.root, "agent")
    staging = posixpath.join(agent_dir, f".new-{digest[:12]}-{secrets.token_hex(4)}")
    files = sorted(AGENT_SRC.rglob("*.py"))
    dirs = sorted(
        {posixpath.join(staging, "device_agent", p.parent.relative_to(AGENT_SRC).as_posix()) for p in files}
    )
    conn.run(["mkdir", "-p", *dirs])
    for path in files:
        conn.put(path, posixpath.join(staging, "device_agent", path.relative_to(AGENT_SRC).as_posix()))
    live = posixpath.join(agent_dir, "device_agent")
    conn.run(["rm", "-rf", live])
    conn.run(["mv", posixpath.join(staging, "device_agent"), live])
    conn.run(["rm", "-rf", staging])
    conn.run(
        ["sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh", digest, posixpath.join(agent_dir, ".agent-hash")]
    )
    log.info("board %s: installed device agent %s (%s)", board.name, device_agent.AGENT_VERSION, digest[:12])


def agent_info(conn: Transport, board: Board) -> dict[str, Any]:
    """The board's ``device_agent info`` answer as a dict."""
    res = conn.run(agent_argv(board, "info"), check=False)
    try:
        info = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError) as exc:
        raise DeviceIncompatible(
            f"board {board.name}: 'device_agent info' gave no JSON (exit {res.code}): {(res.stderr or res.stdout)[-500:]}"
        ) from exc
    if not isinstance(info, dict):
        raise DeviceIncompatible(
            f"board {board.name}: 'device_agent info' answered {info!r}, expected an object"
        )
    return info


def check_info(board: Board, info: dict[str, Any], memory_estimate_mb: float = 0.0) -> None:
    """Refuse a board whose protocol, ORT version, training API, RAM or disk cannot run the job."""
    problems = []
    protocol = info.get("protocol_version", info.get("protocol"))
    if protocol != PROTOCOL_VERSION:
        problems.append(f"agent protocol {protocol!r}, host speaks {PROTOCOL_VERSION}")
    if info.get("ort_version") != board.ort_version:
        problems.append(f"onnxruntime {info.get('ort_version')!r}, inventory expects {board.ort_version}")
    if not info.get("training_api"):
        problems.append(
            f"onnxruntime without the training API ({info.get('training_api_error', 'not importable')})"
        )
    free_mb = _num(info, "mem_available_mb")
    if memory_estimate_mb and free_mb is not None and memory_estimate_mb > free_mb:
        problems.append(f"job needs ~{memory_estimate_mb:.0f} MB RAM, board has {free_mb:.0f} MB available")
    disk_mb = _num(info, "disk_free_mb")
    if disk_mb is not None and disk_mb < 100:
        problems.append(f"only {disk_mb:.0f} MB free disk under {board.root}")
    if problems:
        raise DeviceIncompatible(f"board {board.name} cannot run this job: " + "; ".join(problems))


def _num(info: dict[str, Any], key: str) -> float | None:
    val = info.get(key)
    return float(val) if isinstance(val, int | float) and not isinstance(val, bool) else None
