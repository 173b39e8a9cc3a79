"""Deployment and remote training on a board: agent install, content-addressed upload, jobs.

Board layout (see :mod:`device_agent.protocol`): ``ROOT/agent/device_agent`` (the installed
agent), ``ROOT/blobs/<sha256>`` (uploaded once, verified on the board, renamed atomically),
``ROOT/jobs/<job_id>/`` (``job.json``, ``events.jsonl``, ``result.json`` ...).

Training runs detached on the board (``device_agent start``); the host follows ``events.jsonl``
from a byte offset and reconnects with backoff when the link drops, never delivering an event
(``seq``) twice. Every remote command is a fixed argv with each argument quoted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import posixpath
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import device_agent
from device_agent.protocol import (
    NEVER_RETRY,
    PROTOCOL_VERSION,
    Event,
    ExitCode,
    JobResult,
    JobSpec,
    SpecError,
    valid_job_id,
)
from tasks.errors import (
    DeviceError,
    DeviceIncompatible,
    DeviceUnreachable,
    InvalidJob,
    RemoteCommandFailed,
    TrainingFailed,
    TransferError,
)
from tasks.inventory import Board
from tasks.transport import Progress, Transport, connect

log = logging.getLogger(__name__)

AGENT_SRC = Path(device_agent.__file__).resolve().parent
TERMINAL = ("finished", "failed", "cancelled")
# Fixed helper programs run by the board's python (arguments are passed as argv, never inlined).
LIST_BLOBS = (
    "import os,sys,json,time\nd=sys.argv[1]\nos.makedirs(d,exist_ok=True)\n"
    "for e in os.scandir(d):\n"  # half uploads of a dropped link, untouched for 10 min: never used, removed
    "    if e.name.startswith('.tmp-') and e.stat().st_mtime<time.time()-600: os.unlink(e.path)\n"
    "have={e.name:e.stat().st_size for e in os.scandir(d) if e.is_file() and len(e.name)==64}\n"
    "st=os.statvfs(d)\nprint(json.dumps({'blobs':have,'free':st.f_bavail*st.f_frsize}))"
)
DISK_MARGIN = 16 * 2**20  # bytes kept free on the board beyond the blobs (job files, checkpoints)
VERIFY_BLOB = (
    "import hashlib,os,sys\ntmp,sha,final=sys.argv[1:4]\nh=hashlib.sha256()\n"
    "with open(tmp,'rb') as f:\n    [h.update(b) for b in iter(lambda: f.read(1<<20), b'')]\n"
    "if h.hexdigest()!=sha:\n    os.unlink(tmp); sys.exit(3)\nos.chmod(tmp,0o444)\nos.replace(tmp,final)"
)


@dataclass
class UploadReport:
    """What an upload sent: bytes on the wire, blobs skipped (already there) and uploaded."""

    bytes_sent: int = 0
    skipped: list[str] = field(default_factory=list)
    uploaded: list[str] = field(default_factory=list)


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


def upload_blobs(
    conn: Transport, board: Board, files: dict[str, Path], progress: Progress | None = None, retries: int = 3
) -> UploadReport:
    """Upload the blobs the board lacks (by sha256 + size), verified on the board, renamed atomically."""
    blobs = posixpath.join(board.root, "blobs")
    listing = json.loads(conn.run([board.python, "-c", LIST_BLOBS, blobs]).stdout)
    have, free = listing["blobs"], int(listing["free"])
    report = UploadReport()
    total = sum(Path(p).stat().st_size for sha, p in files.items() if have.get(sha) != Path(p).stat().st_size)
    if total + DISK_MARGIN > free:
        raise DeviceIncompatible(
            f"board {board.name}: not enough disk space under {blobs}: {total / 2**20:.1f} MB to upload "
            f"(+{DISK_MARGIN / 2**20:.0f} MB margin), {free / 2**20:.1f} MB free"
        )
    for sha, path in sorted(files.items()):
        size = Path(path).stat().st_size
        if have.get(sha) == size:
            report.skipped.append(sha)
            continue
        _upload_one(
            conn, board, sha, Path(path), retries, _offset_progress(progress, report.bytes_sent, total)
        )
        report.bytes_sent += size
        report.uploaded.append(sha)
    log.info(
        "board %s: uploaded %d blob(s), %d bytes; %d already there",
        board.name,
        len(report.uploaded),
        report.bytes_sent,
        len(report.skipped),
    )
    return report


def _offset_progress(progress: Progress | None, base: int, total: int) -> Progress | None:
    if progress is None:
        return None
    return lambda done, _size: progress(base + done, total)


def _upload_one(
    conn: Transport, board: Board, sha: str, path: Path, retries: int, progress: Progress | None
) -> None:
    blobs = posixpath.join(board.root, "blobs")
    for attempt in range(1, retries + 1):
        tmp = posixpath.join(blobs, f".tmp-{sha}-{secrets.token_hex(4)}")
        try:
            conn.put(path, tmp, progress)
            res = conn.run(
                [board.python, "-c", VERIFY_BLOB, tmp, sha, posixpath.join(blobs, sha)], check=False
            )
            if res.code == 0:
                return
            err = TransferError(
                f"board {board.name}: blob {sha[:12]} ({path.name}) hash mismatch after upload"
            )
        except (TransferError, DeviceUnreachable) as exc:
            err = exc
            with contextlib.suppress(DeviceError):  # the link may be gone: LIST_BLOBS cleans up later
                conn.run(["rm", "-f", tmp], check=False)
            if isinstance(exc, DeviceUnreachable):
                raise
            if "No space left" in str(exc):
                raise DeviceIncompatible(
                    f"board {board.name}: disk full (no space left on device) under {blobs} "
                    f"while uploading {path.name}; the partial blob was removed"
                ) from exc
        log.warning("upload of %s failed (attempt %d/%d): %s", path.name, attempt, retries, err)
    raise err


def job_dir(board: Board, job_id: str) -> str:
    """``ROOT/jobs/<job_id>`` after validating the id (no separators, no '..', no metacharacters)."""
    try:
        valid_job_id(job_id)
    except SpecError as exc:
        raise InvalidJob(f"job id {job_id!r} refused: {exc}") from exc
    path = posixpath.normpath(posixpath.join(board.root, "jobs", job_id))
    if posixpath.dirname(path) != posixpath.join(posixpath.normpath(board.root), "jobs"):
        raise InvalidJob(f"job id {job_id!r} would leave {board.root}/jobs")
    return path


def create_job(conn: Transport, board: Board, spec: JobSpec) -> str:
    """Write ``job.json`` atomically; idempotent when the same spec is already there."""
    jdir = job_dir(board, spec.job_id)
    text = spec.to_json()
    existing = conn.read_from(posixpath.join(jdir, "job.json"), 0).decode()
    if existing:
        if JobSpec.from_json(existing).to_dict() != spec.to_dict():
            raise InvalidJob(f"job {spec.job_id} already exists on board {board.name} with a different spec")
        return jdir
    conn.run(["mkdir", "-p", jdir])
    tmp = posixpath.join(jdir, f".job.json.{secrets.token_hex(4)}")
    conn.run(
        ["sh", "-c", 'cat > "$1" && mv "$1" "$2"', "sh", tmp, posixpath.join(jdir, "job.json")],
        input=text.encode(),
    )
    return jdir


def start_job(conn: Transport, board: Board, job_id: str) -> str:
    """Start the job detached on the board; 'started' or 'running' (BUSY: already running)."""
    jdir = job_dir(board, job_id)
    res = conn.run(agent_argv(board, "start", jdir), check=False, timeout=60)
    if res.code == ExitCode.BUSY:
        return "running"
    if res.code != 0:
        raise RemoteCommandFailed(agent_argv(board, "start", jdir), res.code, res.stderr or res.stdout)
    return "started"


EventCallback = Callable[[Event], None]


def read_result(conn: Transport, board: Board, job_id: str) -> JobResult | None:
    """The job's ``result.json`` if the job has ended, else None."""
    raw = conn.read_from(posixpath.join(job_dir(board, job_id), "result.json"), 0)
    return JobResult.from_json(raw.decode()) if raw else None


def follow_job(
    conn: Transport,
    board: Board,
    job_id: str,
    offset: int = 0,
    on_event: EventCallback | None = None,
    *,
    poll_s: float = 0.25,
    max_outage_s: float = 300.0,
) -> JobResult:
    """Follow ``events.jsonl`` from ``offset`` until the job ends; reconnects on a dropped link.

    Each event (by ``seq``) is delivered once. Returns the JobResult; raises TrainingFailed for a
    failed or cancelled job (never retried) and DeviceUnreachable after ``max_outage_s`` offline.
    """
    follower = _Follower(board, job_id, offset, on_event)
    link, owned = conn, False
    try:
        while True:
            try:
                result = follower.poll(link)
            except DeviceUnreachable as exc:
                link, owned = _reconnect(board, link, owned, exc, max_outage_s), True
                continue
            if result is not None:
                return _final(result)
            time.sleep(poll_s)
    finally:
        if owned:
            link.close()


class _Follower:
    """Reads new complete lines of ``events.jsonl`` and delivers unseen events in order."""

    def __init__(self, board: Board, job_id: str, offset: int, on_event: EventCallback | None) -> None:
        self.board, self.job_id, self.offset, self.on_event = board, job_id, offset, on_event
        jdir = job_dir(board, job_id)
        self.events_path = posixpath.join(jdir, "events.jsonl")
        self.last_seq = -1
        self.ended = False
        self.idle_polls = 0
        self.restarts = 0

    def poll(self, conn: Transport) -> JobResult | None:
        """One round: deliver new events; the JobResult once the job has ended."""
        data = conn.read_from(self.events_path, self.offset)
        end = data.rfind(b"\n") + 1
        for line in data[:end].decode(errors="replace").splitlines():
            self._deliver(line)
        self.offset += end
        self.idle_polls = 0 if end else self.idle_polls + 1
        if self.ended or self.idle_polls % 40 == 39:  # ~10 s without news: check the job
            result = read_result(conn, self.board, self.job_id)
            if result is None and not self.ended:
                self._revive(conn)
            return result
        return None

    def _revive(self, conn: Transport) -> None:
        """The job shows no progress: resume it when the agent is not running it (crash, reboot)."""
        state = job_status(conn, self.board, self.job_id).get("state")
        if state in ("interrupted", "pending"):
            if self.restarts >= 3:
                raise TrainingFailed(f"job {self.job_id} stopped without a result {self.restarts} times")
            self.restarts += 1
            log.warning("job %s is %s on board %s: resuming it", self.job_id, state, self.board.name)
            start_job(conn, self.board, self.job_id)

    def _deliver(self, line: str) -> None:
        if not line.strip():
            return
        try:
            event = Event.from_json(line)
        except SpecError as exc:
            log.warning("job %s: unreadable event line skipped (%s)", self.job_id, exc)
            return
        if event.seq <= self.last_seq:
            return
        self.last_seq = event.seq
        if event.type == "started":  # a resumed run: an earlier terminal line no longer ends the job
            self.ended = False
        self.ended = self.ended or event.type in TERMINAL
        if self.on_event:
            self.on_event(event)


def _reconnect(board: Board, link: Transport, owned: bool, exc: Exception, max_outage_s: float) -> Transport:
    log.warning("board %s: %s; reconnecting", board.name, exc)
    if owned:
        link.close()
    deadline, delay = time.monotonic() + max_outage_s, 1.0
    while True:
        try:
            link = connect(board)
            log.info("board %s: reconnected", board.name)
            return link
        except DeviceUnreachable as again:
            if time.monotonic() + delay > deadline:
                raise DeviceUnreachable(
                    f"board {board.name}: unreachable for {max_outage_s:.0f} s: {again}"
                ) from again
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def _final(result: JobResult) -> JobResult:
    if result.status != "finished":
        raise TrainingFailed(f"job {result.job_id} {result.status} (exit {result.exit_code}): {result.error}")
    return result


def run_job(
    conn: Transport,
    board: Board,
    spec: JobSpec,
    files: dict[str, Path],
    on_event: EventCallback | None = None,
    progress: Progress | None = None,
    *,
    deployed: bool = False,
) -> tuple[UploadReport, JobResult]:
    """Install + upload + create + start + follow; reattaches when the job id is already on the board.

    A job that ended is returned as it is; one that runs is followed; one that was interrupted
    is resumed by the agent (from its last checkpoint). Nothing is uploaded again in those cases.
    ``deployed=True`` says the caller has just run install_agent and upload_blobs for ``files``
    (the flow's deploy stage): their checks are not repeated (the agent itself still verifies
    every blob's sha256 before training).
    """
    jdir = job_dir(board, spec.job_id)
    if not deployed:
        install_agent(conn, board, spec.memory_estimate_mb)
    report = UploadReport()
    if conn.exists(posixpath.join(jdir, "job.json")):
        log.info("job %s already on board %s: reattaching", spec.job_id, board.name)
    else:
        if not deployed:
            report = upload_blobs(conn, board, files, progress)
        create_job(conn, board, spec)
    if resumable(read_result(conn, board, spec.job_id)):
        log.info("job %s %s on board %s", spec.job_id, start_job(conn, board, spec.job_id), board.name)
    return report, follow_job(conn, board, spec.job_id, 0, on_event)


def resumable(result: JobResult | None) -> bool:
    """True when the job must (re)start: no result yet, cancelled, or failed for a retryable cause."""
    if result is None:
        return True
    return result.status != "finished" and not (result.status == "failed" and result.exit_code in NEVER_RETRY)


def job_status(conn: Transport, board: Board, job_id: str) -> dict[str, Any]:
    """The agent's ``status`` answer for the job (state: pending/running/interrupted/finished/...)."""
    res = conn.run(agent_argv(board, "status", job_dir(board, job_id)), check=False, timeout=60)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {"state": "unknown", "exit_code": res.code, "error": (res.stderr or res.stdout)[-500:]}


def train(
    board: Board,
    spec: JobSpec,
    files: dict[str, Path],
    on_event: EventCallback | None = None,
    *,
    deployed: bool = False,
) -> JobResult:
    """Deploy and train ``spec`` on ``board``; idempotent on ``spec.job_id`` (reattaches)."""
    job_dir(board, spec.job_id)
    conn = connect(board)
    try:
        return run_job(conn, board, spec, files, on_event, deployed=deployed)[1]
    finally:
        conn.close()
