"""The contract between host and board: job spec, events, result, exit codes.

Imported by the device agent *and* by the host, so it uses only the standard library.
Wire types are small frozen dataclasses with pure ``to_dict``/``from_dict`` functions that
validate every field and name the bad one in a :class:`SpecError`.

Board layout under the agent root (e.g. ``~/odl``)::

    blobs/<sha256>            content-addressed artifacts and data (uploaded once)
    jobs/<job_id>/job.json    the JobSpec
    jobs/<job_id>/events.jsonl, result.json, inference.onnx, agent.log, checkpoints/
    agent/device_agent/       the installed agent

Job files refer to blobs by sha256 only; the agent resolves ``blobs/<sha256>`` itself.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
AGENT_VERSION = "0.1.0"

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
ARTIFACT_KEYS = ("training_model", "eval_model", "optimizer_model", "checkpoint")
EVENT_TYPES = ("started", "step", "epoch", "eval", "checkpoint", "finished", "failed", "cancelled")
TASKS = ("classification", "binary", "regression", "embedded")


class ExitCode(enum.IntEnum):
    """Agent exit codes, grouped by cause. 1x: never retry; 2x: artifact/runtime; 3x: environment."""

    OK = 0
    INVALID_SPEC = 10  # job.json malformed or a field is wrong
    PROTOCOL_MISMATCH = 11  # job written for another protocol version
    DATA_MISMATCH = 12  # dataset shape/dtype/labels do not fit the model
    JOB_NOT_FOUND = 13  # no such job directory / job.json
    CANCELLED = 14  # the job was cancelled (checkpoint saved)
    ARTIFACT_INVALID = 20  # blob missing or sha256 mismatch, model does not load
    RUNTIME_ERROR = 21  # ONNX Runtime failed during training
    DIVERGED = 22  # loss became NaN/inf
    ENVIRONMENT = 30  # generic environment problem
    NO_MEMORY = 31  # free RAM below the job's estimate
    NO_DISK = 32  # not enough free disk under the root
    NO_TRAINING_API = 33  # onnxruntime without the training API
    BUSY = 34  # the job is already running in another process


EXIT_HELP: dict[int, str] = {
    ExitCode.OK: "success",
    ExitCode.INVALID_SPEC: "invalid job spec: fix job.json; never retried",
    ExitCode.PROTOCOL_MISMATCH: "job written for another protocol version: upgrade host or agent",
    ExitCode.DATA_MISMATCH: "dataset does not fit the model (shape, dtype, label range, NaN)",
    ExitCode.JOB_NOT_FOUND: "no job directory or job.json at the given path",
    ExitCode.CANCELLED: "job cancelled on request; its last checkpoint is kept",
    ExitCode.ARTIFACT_INVALID: "an artifact or data blob is missing, corrupt or unloadable",
    ExitCode.RUNTIME_ERROR: "ONNX Runtime failed while training",
    ExitCode.DIVERGED: "loss became NaN or infinite; last good checkpoint kept",
    ExitCode.ENVIRONMENT: "the board's environment cannot run the job",
    ExitCode.NO_MEMORY: "free RAM is below the job's memory estimate",
    ExitCode.NO_DISK: "free disk under the agent root is too low",
    ExitCode.NO_TRAINING_API: "onnxruntime on this board has no training API",
    ExitCode.BUSY: "the job is already running",
}

NEVER_RETRY = frozenset(
    {ExitCode.INVALID_SPEC, ExitCode.PROTOCOL_MISMATCH, ExitCode.DATA_MISMATCH, ExitCode.DIVERGED}
)


class SpecError(ValueError):
    """A wire object is malformed; ``field`` names the offending field."""

    def __init__(self, field_name: str, expected: str, got: object = None) -> None:
        self.field = field_name
        self.expected = expected
        got_txt = "" if got is None else f" (got {got!r})"
        super().__init__(f"field '{field_name}': expected {expected}{got_txt}")


def file_sha256(path: object, chunk: int = 1 << 20) -> str:
    """Lowercase hex sha256 of a file read in chunks (``path``: str or os.PathLike)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:  # type: ignore[arg-type]
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def valid_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is a safe name (no separators, no '..', no shell metacharacters)."""
    if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id) or ".." in job_id:
        raise SpecError(
            "job_id", "1-128 chars of [A-Za-z0-9._-], not starting with '.' or '-', no '..'", job_id
        )
    return job_id


def _get(d: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    name = f"{where}.{key}" if where else key
    if key not in d:
        if default is ...:
            raise SpecError(name, f"a value of type {_tname(typ)}", None)
        return default
    val = d[key]
    if val is None and default is None:
        return None
    if isinstance(val, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise SpecError(name, _tname(typ), val)
    if not isinstance(val, typ):
        raise SpecError(name, _tname(typ), val)
    return val


def _tname(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def _reject_unknown(d: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise SpecError(f"{where}.{extra[0]}" if where else extra[0], "no such field (unknown key)")


@dataclass(frozen=True)
class BlobRef:
    """A file held under ``blobs/<sha256>`` on the board."""

    sha256: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size}

    @classmethod
    def from_dict(cls, d: object, where: str) -> BlobRef:
        if not isinstance(d, dict):
            raise SpecError(where, "an object with sha256 and size", d)
        _reject_unknown(d, {"sha256", "size"}, where)
        sha = _get(d, "sha256", str, where)
        if not SHA256_RE.match(sha):
            raise SpecError(f"{where}.sha256", "64 lowercase hex digits", sha)
        size = _get(d, "size", int, where)
        if size < 0:
            raise SpecError(f"{where}.size", "a size >= 0", size)
        return cls(sha, size)


@dataclass(frozen=True)
class DataRef:
    """A dataset for the board: a blob (uploaded by the host) or a path already on the board.

    ``format`` is ``npz`` (arrays ``x`` and ``y``) or ``image-folder`` (class subfolders).
    ``path`` is absolute or relative to the agent root; it is only used when ``blob`` is None.
    """

    format: str
    blob: BlobRef | None = None
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "blob": self.blob.to_dict() if self.blob else None,
            "path": self.path,
        }

    @classmethod
    def from_dict(cls, d: object, where: str) -> DataRef:
        if not isinstance(d, dict):
            raise SpecError(where, "an object with format and blob or path", d)
        _reject_unknown(d, {"format", "blob", "path"}, where)
        fmt = _get(d, "format", str, where)
        if fmt not in ("npz", "image-folder"):
            raise SpecError(f"{where}.format", "'npz' or 'image-folder'", fmt)
        blob_d = d.get("blob")
        blob = BlobRef.from_dict(blob_d, f"{where}.blob") if blob_d is not None else None
        path = _get(d, "path", str, where, None)
        if (blob is None) == (path is None):
            raise SpecError(where, "exactly one of 'blob' or 'path'", d)
        if fmt == "image-folder" and blob is not None:
            raise SpecError(f"{where}.blob", "a 'path' on the board for image-folder datasets", blob_d)
        return cls(fmt, blob, path)


@dataclass(frozen=True)
class TrainParams:
    """What the recipe tells the training loop."""

    batch_size: int
    epochs: int
    lr: float
    warmup_steps: int = 0
    final_lr_ratio: float = 0.0  # linear decay from lr to lr*final_lr_ratio at the last step
    checkpoint_every: int = 0  # steps; 0 = only at epoch ends
    log_every: int = 1  # emit a 'step' event every N steps
    seed: int = 0
    max_steps: int = 0  # 0 = epochs * steps_per_epoch; > 0 stops early (for dry runs)
    drop_last: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: object, where: str = "train") -> TrainParams:
        if not isinstance(d, dict):
            raise SpecError(where, "an object", d)
        names = {f.name for f in dataclasses.fields(cls)}
        _reject_unknown(d, names, where)
        vals: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else ...
            typ: Any = {"int": int, "float": (int, float), "bool": bool}[str(f.type)]
            vals[f.name] = _get(d, f.name, typ, where, default)
        p = cls(**vals)
        p.check(where)
        return p

    def check(self, where: str = "train") -> None:
        """Raise SpecError on values that make no sense."""
        if self.batch_size < 1:
            raise SpecError(f"{where}.batch_size", "an integer >= 1", self.batch_size)
        if self.epochs < 1:
            raise SpecError(f"{where}.epochs", "an integer >= 1", self.epochs)
        if not (self.lr > 0 and self.lr < float("inf")):
            raise SpecError(f"{where}.lr", "a finite number > 0", self.lr)
        for name in ("warmup_steps", "checkpoint_every", "max_steps"):
            if getattr(self, name) < 0:
                raise SpecError(f"{where}.{name}", "an integer >= 0", getattr(self, name))
        if self.log_every < 1:
            raise SpecError(f"{where}.log_every", "an integer >= 1", self.log_every)
        if not 0.0 <= self.final_lr_ratio <= 1.0:
            raise SpecError(f"{where}.final_lr_ratio", "a number in [0, 1]", self.final_lr_ratio)


@dataclass(frozen=True)
class JobSpec:
    """``job.json``: everything the agent needs to run one training job."""

    job_id: str
    artifacts: dict[str, BlobRef]  # keys: ARTIFACT_KEYS
    train_data: DataRef
    train: TrainParams
    task: str  # one of TASKS: decides metrics (accuracy for classification/binary)
    output_names: tuple[str, ...]  # graph outputs kept by export_model_for_inferencing
    eval_data: DataRef | None = None
    feeds: dict[str, str] = field(default_factory=dict)  # model input name -> npz key
    memory_estimate_mb: float = 0.0
    recipe_name: str = ""
    num_classes: int = 0  # classification: labels must be < num_classes (0 = take it from the model)
    protocol: int = PROTOCOL_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "job_id": self.job_id,
            "recipe_name": self.recipe_name,
            "artifacts": {k: v.to_dict() for k, v in self.artifacts.items()},
            "train_data": self.train_data.to_dict(),
            "eval_data": self.eval_data.to_dict() if self.eval_data else None,
            "train": self.train.to_dict(),
            "task": self.task,
            "output_names": list(self.output_names),
            "feeds": dict(self.feeds),
            "memory_estimate_mb": self.memory_estimate_mb,
            "num_classes": self.num_classes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: object) -> JobSpec:
        if not isinstance(d, dict):
            raise SpecError("job", "a JSON object", type(d).__name__)
        protocol = _get(d, "protocol", int, "")
        if protocol != PROTOCOL_VERSION:
            raise SpecError("protocol", f"protocol version {PROTOCOL_VERSION}", protocol)
        _reject_unknown(
            d,
            {
                "protocol",
                "job_id",
                "recipe_name",
                "artifacts",
                "train_data",
                "eval_data",
                "train",
                "task",
                "output_names",
                "feeds",
                "memory_estimate_mb",
                "num_classes",
            },
            "",
        )
        job_id = valid_job_id(d.get("job_id"))
        arts = _get(d, "artifacts", dict, "")
        missing = [k for k in ARTIFACT_KEYS if k not in arts]
        if missing:
            raise SpecError(f"artifacts.{missing[0]}", "a blob reference", None)
        _reject_unknown(arts, set(ARTIFACT_KEYS), "artifacts")
        artifacts = {k: BlobRef.from_dict(arts[k], f"artifacts.{k}") for k in ARTIFACT_KEYS}
        eval_d = d.get("eval_data")
        task = _get(d, "task", str, "")
        if task not in TASKS:
            raise SpecError("task", " or ".join(repr(t) for t in TASKS), task)
        outs = _get(d, "output_names", list, "")
        if not outs or not all(isinstance(o, str) and o for o in outs):
            raise SpecError("output_names", "a non-empty list of output names", outs)
        feeds = _get(d, "feeds", dict, "", {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in feeds.items()):
            raise SpecError("feeds", "a mapping of input name to npz key (strings)", feeds)
        mem = _get(d, "memory_estimate_mb", (int, float), "", 0.0)
        if mem < 0:
            raise SpecError("memory_estimate_mb", "a number >= 0", mem)
        num_classes = _get(d, "num_classes", int, "", 0)
        if num_classes < 0:
            raise SpecError("num_classes", "an integer >= 0 (0 = unknown)", num_classes)
        return cls(
            job_id=job_id,
            artifacts=artifacts,
            train_data=DataRef.from_dict(d.get("train_data"), "train_data"),
            eval_data=DataRef.from_dict(eval_d, "eval_data") if eval_d is not None else None,
            train=TrainParams.from_dict(d.get("train"), "train"),
            task=task,
            output_names=tuple(outs),
            feeds=dict(feeds),
            memory_estimate_mb=float(mem),
            recipe_name=_get(d, "recipe_name", str, "", ""),
            num_classes=num_classes,
            protocol=protocol,
        )

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError("job", f"valid JSON ({exc.msg} at line {exc.lineno})") from exc
        return cls.from_dict(d)


@dataclass(frozen=True)
class Event:
    """One line of ``events.jsonl``. Readers ignore fields they do not know."""

    type: str
    job_id: str
    seq: int  # 0, 1, 2 ... over the whole life of the job, across resumes
    data: dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)
    v: int = PROTOCOL_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": self.v,
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
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError("event", f"a JSON line ({exc.msg})") from exc
        if not isinstance(d, dict):
            raise SpecError("event", "a JSON object", d)
        return cls(
            type=_get(d, "type", str, "event"),
            job_id=_get(d, "job_id", str, "event"),
            seq=_get(d, "seq", int, "event"),
            data=_get(d, "data", dict, "event", {}),
            ts=float(_get(d, "ts", (int, float), "event")),
            v=_get(d, "v", int, "event"),
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
    v: int = PROTOCOL_VERSION

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
        outs = _get(d, "outputs", dict, "result")
        outputs = {}
        for k, o in outs.items():
            if not isinstance(o, dict):
                raise SpecError(f"result.outputs.{k}", "an object with path, sha256, size", o)
            outputs[k] = FileRef(
                path=_get(o, "path", str, f"result.outputs.{k}"),
                sha256=_get(o, "sha256", str, f"result.outputs.{k}"),
                size=_get(o, "size", int, f"result.outputs.{k}"),
            )
        return cls(
            job_id=_get(d, "job_id", str, "result"),
            status=_get(d, "status", str, "result"),
            exit_code=_get(d, "exit_code", int, "result"),
            steps=_get(d, "steps", int, "result"),
            epochs_done=_get(d, "epochs_done", int, "result"),
            duration_s=float(_get(d, "duration_s", (int, float), "result")),
            train_loop_s=float(_get(d, "train_loop_s", (int, float), "result", 0.0)),
            peak_rss_mb=float(_get(d, "peak_rss_mb", (int, float), "result")),
            metrics={k: float(v) for k, v in _get(d, "metrics", dict, "result").items()},
            history=list(_get(d, "history", list, "result", [])),
            outputs=outputs,
            error=_get(d, "error", str, "result", ""),
            versions=dict(_get(d, "versions", dict, "result", {})),
            v=_get(d, "v", int, "result", PROTOCOL_VERSION),
        )

    @classmethod
    def from_json(cls, text: str) -> JobResult:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise SpecError("result", f"valid JSON ({exc.msg})") from exc
