"""One job's folder on the board: spec, blobs, lock, result (its files written whole: :mod:`device_agent.atomic`).

Layout of ``JOBDIR``: ``job.json``, ``events.jsonl``, ``checkpoints/``, ``result.json``,
``inference.onnx``, ``agent.log``, ``agent.pid``, ``.lock`` (flock held by the training
process, so a dead process never leaves a stale lock), ``cancel.request`` and ``batch`` (the step
and samples the training process runs now).
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

from device_agent.atomic import atomic_write
from device_agent.errors import AgentError
from device_agent.protocol import (
    VERSION_KEY,
    BlobRef,
    DataRef,
    ExitCode,
    JobResult,
    JobSpec,
    SpecError,
    check_board_path,
    file_sha256,
)
from device_agent.sysinfo import free_disk_mb, meminfo_mb

LOCK_FD_ENV = "ODL_AGENT_LOCK_FD"
BOARD_LOCK_FD_ENV = "ODL_AGENT_BOARD_LOCK_FD"


@dataclass(frozen=True)
class JobDir:
    """Paths of one job folder and the agent root that holds its blobs."""

    path: Path
    root: Path

    @property
    def spec_file(self) -> Path:
        return self.path / "job.json"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def result_file(self) -> Path:
        return self.path / "result.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def cancel_file(self) -> Path:
        return self.path / "cancel.request"

    @property
    def hold_file(self) -> Path:
        """A test hook: while it exists, the job pauses once it has trained the step it names."""
        return self.path / "hold"

    @property
    def held_file(self) -> Path:
        """Written by a paused job (the step it paused at), removed when it goes on."""
        return self.path / "held"

    @property
    def batch_file(self) -> Path:
        """What the training process runs now (:mod:`device_agent.job.batch_mark`)."""
        return self.path / "batch"

    @property
    def pid_file(self) -> Path:
        return self.path / "agent.pid"

    @property
    def log_file(self) -> Path:
        return self.path / "agent.log"

    def blob(self, sha256: str) -> Path:
        """Where a blob with this hash lives under the root."""
        return self.root / "blobs" / sha256


def open_jobdir(jobdir: str | Path, root: Path) -> JobDir:
    """The JobDir of ``jobdir`` after checking it sits in ``root/jobs`` and holds no symbolic link.

    The agent writes events, results, checkpoints and logs there: a planted link (to /etc/passwd,
    or out of the root) must never be followed, so a job folder with one is refused.
    """
    path = Path(jobdir).expanduser().absolute()
    if not path.is_dir():
        raise AgentError(ExitCode.JOB_NOT_FOUND, f"no job directory {path}")
    jobs = root / "jobs"
    if path.is_symlink() or path.resolve().parent != jobs or jobs.is_symlink():
        raise AgentError(
            ExitCode.INVALID_SPEC,
            f"job directory {path} is not a real folder directly under {jobs}",
            "job_id",
        )
    job = JobDir(path.resolve(), root)
    for entry in [*job.path.iterdir(), *(job.checkpoints.iterdir() if job.checkpoints.is_dir() else [])]:
        if entry.is_symlink():
            raise AgentError(
                ExitCode.INVALID_SPEC,
                f"job directory holds a symbolic link {entry} -> {os.readlink(entry)}; refusing to follow it",
                "job_id",
            )
    return job


def load_spec(job: JobDir) -> JobSpec:
    """Parse and validate ``job.json`` (JOB_NOT_FOUND, INVALID_SPEC, PROTOCOL_MISMATCH)."""
    if not job.spec_file.is_file():
        raise AgentError(ExitCode.JOB_NOT_FOUND, f"no job.json in {job.path}")
    try:
        spec = JobSpec.from_json(job.spec_file.read_text())
    except SpecError as exc:
        code = ExitCode.PROTOCOL_MISMATCH if exc.field == VERSION_KEY else ExitCode.INVALID_SPEC
        raise AgentError(code, f"job.json: {exc}", exc.field) from exc
    if spec.job_id != job.path.name:
        raise AgentError(
            ExitCode.INVALID_SPEC,
            f"job.json: field 'job_id': expected the job folder's name {job.path.name!r} (got {spec.job_id!r})",
            "job_id",
        )
    return spec


def verify_blob(job: JobDir, ref: BlobRef, field: str) -> Path:
    """Return the blob's path after checking it exists with the right size and sha256."""
    path = job.blob(ref.sha256)
    if not path.is_file():
        raise AgentError(
            ExitCode.ARTIFACT_INVALID, f"{field}: blob {ref.sha256} missing under {job.root / 'blobs'}", field
        )
    size = path.stat().st_size
    if size != ref.size:
        raise AgentError(
            ExitCode.ARTIFACT_INVALID,
            f"{field}: blob {ref.sha256} has {size} bytes, expected {ref.size}",
            field,
        )
    actual = file_sha256(path)
    if actual != ref.sha256:
        raise AgentError(
            ExitCode.ARTIFACT_INVALID,
            f"{field}: sha256 mismatch: file has {actual}, expected {ref.sha256}",
            field,
        )
    return path


def verify_inputs(job: JobDir, spec: JobSpec) -> dict[str, Path]:
    """Verify every artifact and data blob; returns local paths keyed by artifact/data name."""
    paths = {k: verify_blob(job, ref, f"artifacts.{k}") for k, ref in spec.artifacts.items()}
    if spec.prefix is not None:
        paths["prefix_model"] = verify_blob(job, spec.prefix.model, "prefix.model")
    if spec.teacher is not None:
        paths["teacher_model"] = verify_blob(job, spec.teacher.model, "teacher.model")
        if spec.teacher.priors is not None:
            paths["teacher_priors"] = verify_blob(job, spec.teacher.priors, "teacher.priors")
    paths["train_data"] = data_path(job, spec.train_data, "train_data")
    if spec.eval_data is not None:
        paths["eval_data"] = data_path(job, spec.eval_data, "eval_data")
    return paths


def data_path(job: JobDir, ref: DataRef, field: str) -> Path:
    """The local path of a dataset: a verified blob or a path on the board."""
    if ref.blob is not None:
        return verify_blob(job, ref.blob, f"{field}.blob")
    where = f"{field}.path"
    check_board_path(ref.path, where, error=lambda line: AgentError(ExitCode.INVALID_SPEC, line, where))
    path = job.root / str(ref.path)  # an absolute path stays itself
    if not path.exists():
        raise AgentError(
            ExitCode.DATA_MISMATCH, f"{field}.path: {path} does not exist on the board", f"{field}.path"
        )
    return path


def check_resources(job: JobDir, spec: JobSpec) -> None:
    """Refuse to start when free RAM is below the estimate (NO_MEMORY) or disk is short (NO_DISK)."""
    avail = meminfo_mb()["available_mb"]
    if spec.memory_estimate_mb > avail:
        raise AgentError(
            ExitCode.NO_MEMORY,
            f"free RAM {avail:.0f} MB is below the job's estimate {spec.memory_estimate_mb:.0f} MB",
            "memory_estimate_mb",
        )
    need = 3 * spec.artifacts["checkpoint"].size / 2**20 + 16
    free = free_disk_mb(job.path)
    if free < need:
        raise AgentError(ExitCode.NO_DISK, f"free disk {free:.0f} MB under {job.path} is below {need:.0f} MB")


def read_result(job: JobDir) -> JobResult | None:
    """The stored result.json, or None when there is none (or it is unreadable)."""
    try:
        return JobResult.from_json(job.result_file.read_text())
    except (FileNotFoundError, SpecError, json.JSONDecodeError):
        return None


def open_lock(job: JobDir) -> int:
    """Open the job's lock file and take an exclusive flock, or raise BUSY. Returns the fd."""
    fd = os.open(job.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AgentError(ExitCode.BUSY, f"job {job.path.name} is already running") from None
    return fd


def open_board_lock(job: JobDir) -> int:
    """Take the board-wide training lock (``ROOT/training.lock``) for ``job``, or raise BOARD_BUSY
    naming the job that holds it: two jobs never train on one board at once."""
    fd = os.open(job.root / "training.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        owner = training_owner(job.root)
        raise AgentError(
            ExitCode.BOARD_BUSY, f"job {owner or '?'} is training on this board; job {job.path.name} waits"
        ) from None
    atomic_write(job.root / "training.owner", job.path.name + "\n")
    return fd


def training_owner(root: Path) -> str | None:
    """The job id that holds (or last held) the board's training lock."""
    try:
        return (root / "training.owner").read_text().strip() or None
    except OSError:
        return None


def inherited_lock(env: str = LOCK_FD_ENV) -> int | None:
    """A lock fd handed over by ``start`` to its detached child, if any."""
    value = os.environ.pop(env, "")
    return int(value) if value.isdigit() else None


def lock_is_held(job: JobDir) -> bool:
    """True when some process holds the job's lock (i.e. it is training now)."""
    try:
        fd = open_lock(job)
    except AgentError:
        return True
    os.close(fd)
    return False
