"""What the agent answers: events, results, its ``info`` and its blob listing. Import these names
from :mod:`device_agent.protocol`, which re-exports them.

Readers ignore fields they do not know (a newer agent may add some); a known field with a wrong
type or value is a :class:`~device_agent.wire.SpecError` that names it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

from device_agent.wire import (
    PROTOCOL_VERSION,
    VERSION_KEY,
    SpecError,
    get_field,
    parse_json,
    read_version,
    typed_fields,
    valid_blob_name,
)


@dataclass(frozen=True)
class Event:
    """One line of ``events.jsonl``."""

    type: str
    job_id: str
    seq: int  # 0, 1, 2 ... over the whole life of the job, across resumes
    data: dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)
    protocol_version: int = PROTOCOL_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                VERSION_KEY: self.protocol_version,
                "type": self.type,
                "ts": self.ts,
                "job_id": self.job_id,
                "seq": self.seq,
                "data": self.data,
            },
            sort_keys=True,
            allow_nan=False,
        )

    @classmethod
    def from_json(cls, line: str) -> Event:
        d = parse_json(line, "event", "a JSON line")
        if not isinstance(d, dict):
            raise SpecError("event", "a JSON object", d)
        return cls(
            type=get_field(d, "type", str, "event"),
            job_id=get_field(d, "job_id", str, "event"),
            seq=get_field(d, "seq", int, "event"),
            data=get_field(d, "data", dict, "event", {}),
            ts=float(get_field(d, "ts", (int, float), "event")),
            protocol_version=read_version(d, "event"),
        )


@dataclass(frozen=True)
class FileRef:
    """An output file of a job, relative to the job directory, with its hash."""

    path: str
    sha256: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class JobResult:
    """``result.json``: how a job ended, its metrics and the hashes of its outputs."""

    job_id: str
    status: str  # finished | failed | cancelled
    exit_code: int
    steps: int
    epochs_done: int
    duration_s: float
    train_loop_s: float  # time spent inside train/eval steps (for overhead accounting)
    peak_rss_mb: float
    metrics: dict[str, float]  # final metrics, e.g. train_loss, eval_loss, eval_accuracy
    history: list[dict[str, float]]  # one row per epoch
    outputs: dict[str, FileRef]  # e.g. inference -> inference.onnx, checkpoint -> checkpoints/final
    error: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    teacher: dict[str, Any] = field(default_factory=dict)  # the teacher's labels (device_agent.teacher)
    protocol_version: int = PROTOCOL_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["outputs"] = {k: v.to_dict() for k, v in self.outputs.items()}
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: object) -> JobResult:
        if not isinstance(d, dict):
            raise SpecError("result", "a JSON object", d)
        outs = get_field(d, "outputs", dict, "result")
        outputs = {}
        for k, o in outs.items():
            if not isinstance(o, dict):
                raise SpecError(f"result.outputs.{k}", "an object with path, sha256, size", o)
            outputs[k] = FileRef(
                path=get_field(o, "path", str, f"result.outputs.{k}"),
                sha256=get_field(o, "sha256", str, f"result.outputs.{k}"),
                size=get_field(o, "size", int, f"result.outputs.{k}"),
            )
        return cls(
            job_id=get_field(d, "job_id", str, "result"),
            status=get_field(d, "status", str, "result"),
            exit_code=get_field(d, "exit_code", int, "result"),
            steps=get_field(d, "steps", int, "result"),
            epochs_done=get_field(d, "epochs_done", int, "result"),
            duration_s=float(get_field(d, "duration_s", (int, float), "result")),
            train_loop_s=float(get_field(d, "train_loop_s", (int, float), "result", 0.0)),
            peak_rss_mb=float(get_field(d, "peak_rss_mb", (int, float), "result")),
            metrics={k: float(v) for k, v in get_field(d, "metrics", dict, "result").items()},
            history=list(get_field(d, "history", list, "result", [])),
            outputs=outputs,
            error=get_field(d, "error", str, "result", ""),
            versions=dict(get_field(d, "versions", dict, "result", {})),
            teacher=dict(get_field(d, "teacher", dict, "result", {})),
            protocol_version=read_version(d, "result", PROTOCOL_VERSION),
        )

    @classmethod
    def from_json(cls, text: str) -> JobResult:
        return cls.from_dict(parse_json(text, "result", "valid JSON"))


@dataclass(frozen=True)
class BoardInfo:
    """The ``info`` answer: what the board runs and has, for the host's compatibility check.

    The host checks ``protocol_version`` itself (see ``tasks.board.agent.check_info``), so an
    agent of another release is reported as such rather than as a malformed answer.
    """

    protocol_version: int
    agent_version: str
    python_version: str
    numpy_version: str
    ort_version: str  # "missing (...)" when onnxruntime does not import at all
    training_api: bool
    training_api_error: str  # "" when the training API loads
    mem_total_mb: float
    mem_available_mb: float  # MemAvailable, or less under a cgroup memory limit (its headroom)
    disk_free_mb: float  # on the filesystem of the agent root
    root: str
    cpu_count: int
    machine: str
    torch_loaded: bool
    # The cgroup memory limit the kernel enforces on the agent (MB), None without one. Optional:
    # an agent of an earlier release does not send it, and a host that does not know it ignores it.
    mem_limit_mb: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: object) -> BoardInfo:
        if not isinstance(d, dict):
            raise SpecError("info", "a JSON object", d)
        info = cls(**typed_fields(cls, d, "info"))
        for name in ("mem_total_mb", "mem_available_mb", "disk_free_mb", "mem_limit_mb"):
            if (getattr(info, name) or 0) < 0:
                raise SpecError(f"info.{name}", "a number >= 0", getattr(info, name))
        if info.cpu_count < 1:
            raise SpecError("info.cpu_count", "an integer >= 1", info.cpu_count)
        return info


@dataclass(frozen=True)
class BlobListing:
    """The ``blobs`` answer: the blobs under ``ROOT/blobs`` (sha256 -> size) and the free bytes there."""

    blobs: dict[str, int]
    free: int

    def to_dict(self) -> dict[str, Any]:
        return {"blobs": dict(self.blobs), "free": self.free}

    @classmethod
    def from_dict(cls, d: object) -> BlobListing:
        if not isinstance(d, dict):
            raise SpecError("blobs", "a JSON object", d)
        have = get_field(d, "blobs", dict, "blobs")
        for sha, size in have.items():
            valid_blob_name(sha, "blobs.blobs")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise SpecError(f"blobs.blobs.{sha}", "a size >= 0", size)
        free = get_field(d, "free", int, "blobs")
        if free < 0:
            raise SpecError("blobs.free", "a number of bytes >= 0", free)
        return cls(dict(have), free)
