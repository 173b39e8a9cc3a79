"""What the host sends: ``job.json`` (:class:`JobSpec`) and its parts (its blobs are
:class:`~device_agent.wire.BlobRef`). Import these names from :mod:`device_agent.protocol`, which
re-exports them."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from device_agent.keypoints_spec import KeypointsScoring
from device_agent.names import valid_job_id
from device_agent.prefix_spec import PrefixSpec
from device_agent.privacy_spec import LocalPrivacy
from device_agent.teacher_spec import TeacherSpec
from device_agent.wire import (
    PROTOCOL_VERSION,
    VERSION_KEY,
    BlobRef,
    SpecError,
    check_version,
    get_field,
    parse_json,
    reject_unknown,
    typed_fields,
    valid_blob_name,
)

ARTIFACT_KEYS = ("training_model", "eval_model", "optimizer_model", "checkpoint")
# the artifacts of each training runtime (``runtime``): ONNX Runtime's training graphs, or the
# autograd runtime's step graphs, step.json (feeds, optimizer, offsets) and inference template
RUNTIME_ARTIFACTS = {
    "ort-training": ARTIFACT_KEYS,
    "autograd": ("train_step", "eval_step", "step", "checkpoint", "inference_template"),
}
DEFAULT_RUNTIME = "ort-training"
TASKS = ("classification", "binary", "regression", "segmentation", "keypoints", "embedded")
DATA_FORMATS = ("npz", "image-folder", "npz-shards")
DATA_FILE_RE = re.compile(r"^(?!\.)[A-Za-z0-9._ -]{1,128}(/(?!\.)[A-Za-z0-9._ -]{1,128})?$")


@dataclass(frozen=True)
class DataFile:
    """One file of a board dataset folder, as a job trained on it: relative name, sha256, size."""

    name: str
    sha256: str
    size: int
    samples: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: object, where: str) -> DataFile:
        if not isinstance(d, dict):
            raise SpecError(where, "an object with name, sha256, size and samples", d)
        reject_unknown(d, {"name", "sha256", "size", "samples"}, where)
        name = get_field(d, "name", str, where)
        if not DATA_FILE_RE.match(name) or ".." in name:
            raise SpecError(f"{where}.name", "a file name or class/file inside the dataset folder", name)
        sha = valid_blob_name(get_field(d, "sha256", str, where), f"{where}.sha256")
        size, samples = get_field(d, "size", int, where), get_field(d, "samples", int, where, 1)
        if size < 0 or samples < 1:
            raise SpecError(f"{where}.samples", "size >= 0 and samples >= 1", d)
        return cls(name, sha, size, samples)


@dataclass(frozen=True)
class DataRef:
    """A dataset for the board: a blob (uploaded by the host) or a path already on the board.

    ``format`` is ``npz`` (arrays ``x`` and ``y``), ``image-folder`` (class subfolders) or
    ``npz-shards`` (a folder of .npz files with the same arrays). ``path`` is absolute or relative
    to the agent root; it is only used when ``blob`` is None. ``files`` (folders only) pins the
    exact files of the folder the job trains on, each verified by sha256 before training;
    ``classes`` the class folders of an image folder, in label order.
    """

    format: str
    blob: BlobRef | None = None
    path: str | None = None
    files: tuple[DataFile, ...] | None = None
    classes: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": self.format,
            "blob": self.blob.to_dict() if self.blob else None,
            "path": self.path,
        }
        if self.files is not None:
            out["files"] = [f.to_dict() for f in self.files]
        if self.classes is not None:
            out["classes"] = list(self.classes)
        return out

    @classmethod
    def from_dict(cls, d: object, where: str) -> DataRef:
        if not isinstance(d, dict):
            raise SpecError(where, "an object with format and blob or path", d)
        reject_unknown(d, {"format", "blob", "path", "files", "classes"}, where)
        fmt = get_field(d, "format", str, where)
        if fmt not in DATA_FORMATS:
            raise SpecError(f"{where}.format", " or ".join(repr(f) for f in DATA_FORMATS), fmt)
        blob_d = d.get("blob")
        blob = BlobRef.from_dict(blob_d, f"{where}.blob") if blob_d is not None else None
        path = get_field(d, "path", str, where, None)
        if (blob is None) == (path is None):
            raise SpecError(where, "exactly one of 'blob' or 'path'", d)
        if fmt != "npz" and blob is not None:
            raise SpecError(f"{where}.blob", f"a 'path' on the board for {fmt} datasets", blob_d)
        files = get_field(d, "files", list, where, None)
        if files is not None:
            if fmt == "npz" or not files:
                raise SpecError(f"{where}.files", "a non-empty list, for a dataset folder only", files)
            files = tuple(DataFile.from_dict(f, f"{where}.files[{i}]") for i, f in enumerate(files))
        classes = get_field(d, "classes", list, where, None)
        if classes is not None and not all(isinstance(c, str) and c for c in classes):
            raise SpecError(f"{where}.classes", "a list of class folder names", classes)
        return cls(fmt, blob, path, files, tuple(classes) if classes is not None else None)


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
        reject_unknown(d, {f.name for f in dataclasses.fields(cls)}, where)
        p = cls(**typed_fields(cls, d, where))
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


JOB_KEYS = {VERSION_KEY, "job_id", "recipe_name", "artifacts", "train_data", "eval_data", "train", "task",
            "ignore_index", "keypoints",
            "output_names", "feeds", "memory_estimate_mb", "num_classes", "prefix", "teacher", "runtime",
            "privacy"}  # fmt: skip


@dataclass(frozen=True)
class JobSpec:
    """``job.json``: everything the agent needs to run one training job."""

    job_id: str
    artifacts: dict[str, BlobRef]  # keys: RUNTIME_ARTIFACTS[runtime]
    train_data: DataRef
    train: TrainParams
    task: str  # one of TASKS: decides metrics (accuracy for classification/binary)
    output_names: tuple[str, ...]  # graph outputs kept by export_model_for_inferencing
    eval_data: DataRef | None = None
    feeds: dict[str, str] = field(default_factory=dict)  # model input name -> npz key
    memory_estimate_mb: float = 0.0
    recipe_name: str = ""
    num_classes: int = 0  # classification: labels must be < num_classes (0 = take it from the model)
    prefix: PrefixSpec | None = None  # frozen-prefix caching: the artifacts train the suffix
    teacher: TeacherSpec | None = None  # labels the unlabeled shards of train_data before training
    ignore_index: int | None = None  # segmentation: the label of pixels no loss counts (not a class)
    keypoints: KeypointsScoring | None = None  # keypoints: the recipe's PCK threshold and decoding
    privacy: LocalPrivacy | None = None  # a fleet round's local DP: only a clipped, noised update leaves
    runtime: str = DEFAULT_RUNTIME  # how the trainer steps: one of RUNTIME_ARTIFACTS
    protocol_version: int = PROTOCOL_VERSION

    def to_dict(self) -> dict[str, Any]:
        return (
            {
                VERSION_KEY: self.protocol_version,
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
            | ({"prefix": self.prefix.to_dict()} if self.prefix else {})
            | ({"teacher": self.teacher.to_dict()} if self.teacher else {})
            | ({"ignore_index": self.ignore_index} if self.ignore_index is not None else {})
            | ({"keypoints": self.keypoints.to_dict()} if self.keypoints else {})
            | ({"privacy": self.privacy.to_dict()} if self.privacy else {})
            | ({"runtime": self.runtime} if self.runtime != DEFAULT_RUNTIME else {})
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: object) -> JobSpec:
        if not isinstance(d, dict):
            raise SpecError("job", "a JSON object", type(d).__name__)
        version = check_version(d, "")
        reject_unknown(d, JOB_KEYS, "")
        job_id = valid_job_id(d.get("job_id"))
        runtime = get_field(d, "runtime", str, "", DEFAULT_RUNTIME)
        if runtime not in RUNTIME_ARTIFACTS:
            raise SpecError("runtime", " or ".join(repr(r) for r in RUNTIME_ARTIFACTS), runtime)
        keys = RUNTIME_ARTIFACTS[runtime]
        arts = get_field(d, "artifacts", dict, "")
        missing = [k for k in keys if k not in arts]
        if missing:
            raise SpecError(f"artifacts.{missing[0]}", f"a blob reference (runtime {runtime!r})", None)
        reject_unknown(arts, set(keys), "artifacts")
        artifacts = {k: BlobRef.from_dict(arts[k], f"artifacts.{k}") for k in keys}
        eval_d = d.get("eval_data")
        task = get_field(d, "task", str, "")
        if task not in TASKS:
            raise SpecError("task", " or ".join(repr(t) for t in TASKS), task)
        outs = get_field(d, "output_names", list, "")
        if not outs or not all(isinstance(o, str) and o for o in outs):
            raise SpecError("output_names", "a non-empty list of output names", outs)
        feeds = get_field(d, "feeds", dict, "", {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in feeds.items()):
            raise SpecError("feeds", "a mapping of input name to npz key (strings)", feeds)
        mem = get_field(d, "memory_estimate_mb", (int, float), "", 0.0)
        if mem < 0:
            raise SpecError("memory_estimate_mb", "a number >= 0", mem)
        num_classes = get_field(d, "num_classes", int, "", 0)
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
            recipe_name=get_field(d, "recipe_name", str, "", ""),
            num_classes=num_classes,
            prefix=PrefixSpec.from_dict(d["prefix"]) if d.get("prefix") is not None else None,
            teacher=TeacherSpec.from_dict(d["teacher"]) if d.get("teacher") is not None else None,
            ignore_index=get_field(d, "ignore_index", int, "", None),
            keypoints=KeypointsScoring.from_dict(d["keypoints"]) if d.get("keypoints") is not None else None,
            privacy=LocalPrivacy.from_dict(d["privacy"]) if d.get("privacy") is not None else None,
            runtime=runtime,
            protocol_version=version,
        )

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls.from_dict(parse_json(text, "job", "valid JSON"))
