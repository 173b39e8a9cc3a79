"""The device agent on a board: install it when its content hash changed, ask its ``info``, refuse
a board that cannot run a job (protocol, ORT version, training runtime, RAM, disk).

A job of the ORT training runtime needs ONNX Runtime's training API on the board. A board whose
inventory entry lists its ``runtimes`` without ``"ort-training"`` is refused before anything reaches it; any
other board once its agent's ``info`` says the API is missing, before the job's files are sent."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import posixpath
import secrets
import tarfile
import tempfile
from pathlib import Path

import device_agent
from device_agent.protocol import PROTOCOL_VERSION, VERSION_KEY, BoardInfo, SpecError
from tasks.board.inventory import Board
from tasks.board.transport import Transport
from tasks.errors import DeviceIncompatible

log = logging.getLogger(__name__)

AGENT_SRC = Path(device_agent.__file__).resolve().parent
# the job spec's runtime (device_agent.protocol.RUNTIME_ARTIFACTS) that needs ONNX Runtime's training API
ORT_RUNTIME = "ort-training"


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


def install_agent(
    conn: Transport, board: Board, memory_estimate_mb: float = 0.0, runtime: str | None = None
) -> BoardInfo:
    """Install the agent when its hash differs, then check ``info``; DeviceIncompatible on mismatch.

    ``runtime`` is the training runtime of the job about to be deployed (None: no job, e.g.
    ``odl board info``); one the board's inventory entry rules out is refused before any upload.
    """
    if runtime == ORT_RUNTIME and board.runtimes and ORT_RUNTIME not in board.runtimes:
        raise DeviceIncompatible(no_training_api(board.name, board.arch or "arch not stated"))
    want = agent_hash()
    stamp = posixpath.join(board.root, "agent", ".agent-hash")
    have = conn.run(["cat", stamp], check=False).stdout.strip()
    if have != want:
        _upload_agent(conn, board, want)
    info = agent_info(conn, board)
    check_info(board, info, memory_estimate_mb, runtime)
    return info


def no_training_api(name: str, machine: str, ort_version: str = "") -> str:
    """The one line refusing an ORT-training job on board ``name`` that has no training API."""
    if machine in ("aarch64", "arm64"):
        why = "onnxruntime-training has no aarch64 wheel"
    elif ort_version:
        why = f"its onnxruntime {ort_version} is the inference-only build"
    else:
        why = "the inventory lists the runtimes it can run without 'ort-training'"
    return f'board {name} ({machine}) has no onnxruntime training API: {why}; use [training] runtime = "autograd"'


# Run by the board's python: unpack the agent tarball beside the live agent, swap it in, write
# the hash stamp, remove the tarball. Members are checked first (plain files under
# device_agent/, no absolute path, no "..").
UNPACK = r"""
import os, shutil, sys, tarfile
tar, agent_dir, digest = sys.argv[1:]
staging = tar[:-len(".tar.gz")]
with tarfile.open(tar) as t:
    for m in t.getmembers():
        parts = m.name.split("/")
        if not m.isfile() or parts[0] != "device_agent" or ".." in parts or m.name.startswith("/"):
            sys.exit("agent tarball: unexpected member %r" % m.name)
    t.extractall(staging, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
live = os.path.join(agent_dir, "device_agent")
shutil.rmtree(live, ignore_errors=True)
os.rename(os.path.join(staging, "device_agent"), live)
shutil.rmtree(staging, ignore_errors=True)
os.remove(tar)
with open(os.path.join(agent_dir, ".agent-hash"), "w") as fh:
    fh.write(digest + "\n")
"""


def agent_tarball(dest: Path) -> int:
    """Write the host's ``device_agent`` .py files as ``device_agent/...`` in a gzip tarball with
    fixed owners, modes and times; returns the number of files."""
    files = sorted(AGENT_SRC.rglob("*.py"))
    with tarfile.open(dest, "w:gz", compresslevel=9) as tar:
        for path in files:
            info = tarfile.TarInfo("device_agent/" + path.relative_to(AGENT_SRC).as_posix())
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return len(files)


def _upload_agent(conn: Transport, board: Board, digest: str) -> None:
    """Send the agent as one tarball (one transfer and two commands, whatever the link's delay)."""
    agent_dir = posixpath.join(board.root, "agent")
    remote = posixpath.join(agent_dir, f".new-{digest[:12]}-{secrets.token_hex(4)}.tar.gz")
    with tempfile.TemporaryDirectory(prefix="odl-agent-") as tmp:
        local = Path(tmp) / "device_agent.tar.gz"
        count = agent_tarball(local)
        conn.run(["mkdir", "-p", agent_dir])
        conn.put(local, remote)
        size = local.stat().st_size
    res = conn.run([board.python, "-c", UNPACK, remote, agent_dir, digest], check=False)
    if res.code != 0:
        raise DeviceIncompatible(
            f"board {board.name}: unpacking the device agent with {board.python} failed "
            f"(exit {res.code}): {(res.stderr or res.stdout)[-500:]}"
        )
    log.info("board %s: installed device agent %s (%s; %d files, %d bytes)", board.name,
             device_agent.AGENT_VERSION, digest[:12], count, size)  # fmt: skip


def last_json_line(text: str) -> object:
    """The agent's answer: the last line of its stdout parsed as JSON (None when there is none)."""
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return None


def agent_info(conn: Transport, board: Board) -> BoardInfo:
    """The board's ``device_agent info`` answer; DeviceIncompatible when it cannot be read.

    An agent of another protocol version is refused as such, even when its answer has other fields.
    """
    res = conn.run(agent_argv(board, "info"), check=False)
    raw = last_json_line(res.stdout)
    if not isinstance(raw, dict):
        raise DeviceIncompatible(
            f"board {board.name}: 'device_agent info' gave no JSON object (exit {res.code}): "
            f"{(res.stderr or res.stdout)[-500:]}"
        )
    try:
        return BoardInfo.from_dict(raw)
    except SpecError as exc:
        if raw.get(VERSION_KEY) != PROTOCOL_VERSION:
            raise DeviceIncompatible(
                f"board {board.name} cannot run this job: agent protocol {raw.get(VERSION_KEY)!r}, "
                f"host speaks {PROTOCOL_VERSION}"
            ) from exc
        raise DeviceIncompatible(
            f"board {board.name}: 'device_agent info' answer is malformed: {exc}"
        ) from exc


def check_info(
    board: Board, info: BoardInfo, memory_estimate_mb: float = 0.0, runtime: str | None = None
) -> None:
    """Refuse a board whose protocol, ORT version, RAM or disk cannot run the job, or whose missing
    training API rules out a job of the ORT ``runtime`` (that alone, in its own line)."""
    ort_missing = info.ort_version.startswith("missing")
    if runtime == ORT_RUNTIME and not info.training_api and not ort_missing:
        raise DeviceIncompatible(no_training_api(board.name, info.machine, info.ort_version))
    problems = []
    if info.protocol_version != PROTOCOL_VERSION:
        problems.append(f"agent protocol {info.protocol_version}, host speaks {PROTOCOL_VERSION}")
    if info.ort_version != board.ort_version:
        problems.append(f"onnxruntime {info.ort_version!r}, inventory expects {board.ort_version}")
    if runtime == ORT_RUNTIME and not info.training_api:
        problems.append(
            f"onnxruntime without the training API ({info.training_api_error or 'not importable'})"
        )
    if memory_estimate_mb and memory_estimate_mb > info.mem_available_mb:
        cap = f" under its {info.mem_limit_mb:.0f} MB cgroup limit" if info.mem_limit_mb else ""
        problems.append(
            f"job needs ~{memory_estimate_mb:.0f} MB RAM, board has {info.mem_available_mb:.0f} MB available{cap}"
        )
    if info.disk_free_mb < 100:
        problems.append(f"only {info.disk_free_mb:.0f} MB free disk under {board.root}")
    if problems:
        raise DeviceIncompatible(f"board {board.name} cannot run this job: " + "; ".join(problems))
