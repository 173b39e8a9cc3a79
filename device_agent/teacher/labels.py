"""Labels from a teacher, on the board: the job's unlabeled shards get the teacher's outputs, and the
student trains on the labels they give (``job.json``'s ``teacher``, :mod:`device_agent.teacher_spec`).

A shard is unlabeled when it has no ``target`` array (a capture process appends images only).
Before training, the agent runs the teacher (ORT inference, ``batch_size`` rows at a time) over
every unlabeled shard of the job that has no stored outputs yet and stores its log-probabilities
beside the shards, in ``<folder>/.labels/<key>/`` (temporary name, then renamed: a killed job
keeps the shards done and labels the others when it resumes). ``key`` names the teacher and how it is fed, so another
teacher labels afresh and a replayed shard is not labelled twice. The rule turning outputs into
labels (threshold, class cap, temperature) is applied when the dataset opens, over all the job's
teacher-labeled samples; its figures (counts, confidence histogram, classes) go into the result:
aggregates only, no sample leaves the board.
"""

from __future__ import annotations

import functools
import logging
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from device_agent.atomic import atomic_savez
from device_agent.data.checks import np_dtype
from device_agent.data.readers import NpzDataset, load_npz_arrays
from device_agent.errors import AgentError
from device_agent.ort import load_onnxruntime, session_options
from device_agent.protocol import ExitCode, TeacherSpec, file_sha256
from device_agent.sysinfo import peak_rss_mb

log = logging.getLogger(__name__)
LABELS_DIR = ".labels"  # hidden: never listed as a shard or a class folder
HIST_BINS = 10


def labels_file(folder: Path, teacher: TeacherSpec, shard: Path) -> Path:
    """Where the teacher's outputs for ``shard`` are stored (named by the shard's content too)."""
    st = shard.stat()
    sha = _sha(str(shard), st.st_size, st.st_mtime_ns)
    return folder / LABELS_DIR / teacher.key / f"{sha[:16]}-{shard.name}"


@functools.lru_cache(maxsize=4096)
def _sha(path: str, size: int, mtime_ns: int) -> str:
    """A shard's sha256, hashed once per process (the labelling and the dataset both ask)."""
    return file_sha256(path)


def has_array(path: Path, key: str) -> bool:
    """Whether the npz ``path`` holds array ``key`` (read from the zip directory only)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return f"{key}.npy" in zf.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise AgentError(ExitCode.DATA_MISMATCH, f"train_data: {path} is not an .npz file ({exc})") from exc


def open_teacher(path: Path, teacher: TeacherSpec) -> tuple[Any, str, str, np.dtype]:
    """(session, input name, output name, input dtype) of the teacher model."""
    ort = load_onnxruntime()
    try:
        sess = ort.InferenceSession(str(path), session_options(ort), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises several exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AgentError(
            ExitCode.ARTIFACT_INVALID, f"teacher.model: does not load: {first}", "teacher.model"
        ) from exc
    inp = sess.get_inputs()[0]
    outs = [o.name for o in sess.get_outputs()]
    out = teacher.output or outs[0]
    if out not in outs:
        raise AgentError(
            ExitCode.INVALID_SPEC, f"teacher.output: {out!r} is not an output (has {outs})", "teacher.output"
        )
    return sess, inp.name, out, np_dtype(inp.type)


def log_probs(out: np.ndarray, scores: str) -> np.ndarray:
    """Per-row log-probabilities of the teacher's ``[N, C]`` output (logits or probabilities)."""
    out = np.asarray(out, dtype=np.float64)
    if out.ndim != 2:
        raise AgentError(ExitCode.DATA_MISMATCH, f"teacher.output: expected [N, classes], got shape {out.shape}",
                         "teacher.output")  # fmt: skip
    if scores == "logits":
        z = out - out.max(axis=1, keepdims=True)
        return (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).astype(np.float32)
    if out.min() < -1e-4 or out.max() > 1 + 1e-4 or np.abs(out.sum(axis=1) - 1).max() > 1e-3:
        raise AgentError(
            ExitCode.DATA_MISMATCH,
            f"teacher.scores: 'probabilities', but the output holds values in [{out.min():.3g}, {out.max():.3g}] "
            "or rows not summing to 1: set scores = 'logits'",
            "teacher.scores",
        )
    return np.log(np.clip(out, 1e-12, 1.0)).astype(np.float32)


def label_shards(
    model: Path, teacher: TeacherSpec, folder: Path, shards: list[Path], events: Any, digest: Any = None
) -> dict[str, Any]:
    """Store what ``digest`` keeps of the teacher's outputs (default :func:`class_digest`) for every
    shard of ``shards`` that has none yet; timing figures."""
    digest = digest or class_digest
    todo = [p for p in shards if not labels_file(folder, teacher, p).is_file()]
    figures = {"shards_labelled": len(todo), "shards_reused": len(shards) - len(todo), "seconds": 0.0,
               "samples_per_s": None, "teacher_peak_rss_mb": None}  # fmt: skip
    if not todo:
        return figures
    t0, done = time.monotonic(), 0
    sess, in_name, out_name, dtype = open_teacher(model, teacher)
    outputs = [out_name] + ([teacher.boxes_output] if teacher.labels == "boxes" else [])
    total = sum(_rows(p, teacher) for p in todo)
    last = 0.0
    for path in todo:
        x = load_npz_arrays(path, "train_data")[teacher.input]
        parts = []
        for start in range(0, len(x), teacher.batch_size):
            batch = np.ascontiguousarray(x[start : start + teacher.batch_size], dtype=dtype)
            try:
                outs = sess.run(outputs, {in_name: batch})
            except Exception as exc:  # noqa: BLE001
                raise AgentError(ExitCode.RUNTIME_ERROR, f"teacher.model: inference failed on {path.name}: {exc}",
                                 "teacher.model") from exc  # fmt: skip
            parts.append(digest(outs, teacher))
            done += len(batch)
            if events is not None and (time.monotonic() - last > 1.0 or done == total):
                last = time.monotonic()
                events.emit("labels", shard=path.name, done=done, total=total)
        _store(
            labels_file(folder, teacher, path), {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        )
        log.info("teacher labelled %s (%d samples)", path.name, len(x))
    del sess
    seconds = time.monotonic() - t0
    figures.update(seconds=round(seconds, 3), samples=done, samples_per_s=round(done / max(seconds, 1e-9), 1),
                   teacher_peak_rss_mb=peak_rss_mb())  # fmt: skip
    return figures


def _rows(path: Path, teacher: TeacherSpec) -> int:
    arrays = load_npz_arrays(path, "train_data")
    if teacher.input not in arrays:
        raise AgentError(ExitCode.DATA_MISMATCH, f"train_data: {path.name} has no array {teacher.input!r} for the "
                         f"teacher (has {sorted(arrays)})", "teacher.input")  # fmt: skip
    return len(arrays[teacher.input])


def class_digest(outs: list[np.ndarray], teacher: TeacherSpec) -> dict[str, np.ndarray]:
    """What is stored of one batch of a class teacher's outputs: its log-probabilities."""
    return {"logp": log_probs(outs[0], teacher.scores)}


def _store(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_savez(path, arrays)


class RowView:
    """Rows ``rows`` of an array, read only when asked (the shard stays memory-mapped)."""

    def __init__(self, base: Any, rows: np.ndarray) -> None:
        self.base, self.rows = base, rows
        self.shape = (len(rows), *base.shape[1:])
        self.dtype, self.ndim = base.dtype, base.ndim

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: Any) -> np.ndarray:
        return np.asarray(self.base[self.rows[idx]])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)


class LabeledShard:
    """A shard's inputs with the label input taken from elsewhere (the teacher, or a one-hot of the
    shard's own labels), restricted to ``rows``: what :class:`~device_agent.data.datasets.ShardDataset` reads."""

    def __init__(self, arrays: dict[str, Any], field: str) -> None:
        self.arrays, self.field = arrays, field

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {k: np.asarray(v[idx]) for k, v in self.arrays.items()}


@dataclass
class TeacherData:
    """The job's shards, labeled, and the figures of the labels the teacher gave."""

    shards: list[Any]
    figures: dict[str, Any] = field(default_factory=dict)


def teacher_shards(model: Path, teacher: TeacherSpec, folder: Path, paths: list[Path], names: list[str],
                   feeds: dict[str, str], classes: int, events: Any, field_name: str) -> TeacherData:  # fmt: skip
    """Label the unlabeled shards of ``paths`` (or reuse their stored outputs) and open every shard
    with its labels: the teacher's for those, the shard's own for the others (one-hot for soft labels)."""
    mapping = feeds or dict(zip(names, ("x", "y"), strict=False))
    label_input = next((n for n, k in mapping.items() if k == teacher.target and n in names), None)
    if label_input is None:
        raise AgentError(ExitCode.INVALID_SPEC, f"teacher.target: no model input is fed from {teacher.target!r} "
                         f"(feeds: {mapping})", "teacher.target")  # fmt: skip
    unlabeled = [p for p in paths if not has_array(p, teacher.target)]
    figures = label_shards(model, teacher, folder, unlabeled, events)
    logps = {
        p.name: load_npz_arrays(labels_file(folder, teacher, p), "teacher labels")["logp"] for p in unlabeled
    }
    want = teacher.num_classes or classes
    for name, lp in logps.items():
        if want and lp.shape[1] != want:
            raise AgentError(ExitCode.DATA_MISMATCH, f"teacher.output: {lp.shape[1]} classes for {name}, the student "
                             f"has {want}", "teacher.output")  # fmt: skip
    keep, figures_rule = select_rows(teacher, logps)
    figures.update(figures_rule, unlabeled_shards=len(unlabeled), labeled_shards=len(paths) - len(unlabeled))
    shards: list[Any] = []
    width = want or (next(iter(logps.values())).shape[1] if logps else 0)
    for p in paths:
        where = f"{field_name} ({p.name})"
        if p.name in logps:
            rows = keep[p.name]
            arrays = {
                n: RowView(load_npz_arrays(p, where)[mapping[n]], rows) for n in names if n != label_input
            }
            arrays[label_input] = make_labels(logps[p.name][rows], teacher)
            if len(rows):
                shards.append(LabeledShard(arrays, where))
        elif teacher.labels == "soft":
            ds = NpzDataset(p, names, feeds, where)
            y = np.asarray(ds.arrays[label_input], dtype=np.int64)
            shards.append(LabeledShard({**ds.arrays, label_input: np.eye(width, dtype=np.float32)[y]}, where))
        else:
            shards.append(NpzDataset(p, names, feeds, where))
    if not shards:
        raise AgentError(ExitCode.DATA_MISMATCH, f"{field_name}: the teacher kept no sample (threshold "
                         f"{teacher.threshold}): nothing to train on", "teacher.threshold")  # fmt: skip
    return TeacherData(shards, figures)


def make_labels(logp: np.ndarray, teacher: TeacherSpec) -> np.ndarray:
    """Hard labels (int64 classes) or soft ones (the distribution at the temperature, float32)."""
    if teacher.labels == "hard":
        return logp.argmax(axis=1).astype(np.int64)
    z = logp.astype(np.float64) / teacher.temperature
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return (p / p.sum(axis=1, keepdims=True)).astype(np.float32)


def select_rows(
    teacher: TeacherSpec, logps: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The rows kept per shard (confidence >= threshold, then at most ``balance_cap`` per class, the
    most confident first, over all the job's teacher-labeled samples) and the figures of the choice."""
    names = sorted(logps)
    if not names:
        return {}, {"teacher_samples": 0, "kept": 0, "dropped_threshold": 0, "dropped_cap": 0}
    conf = np.concatenate([np.exp(logps[n].max(axis=1)) for n in names])
    cls = np.concatenate([logps[n].argmax(axis=1) for n in names])
    owner = np.concatenate([np.full(len(logps[n]), i) for i, n in enumerate(names)])
    local = np.concatenate([np.arange(len(logps[n])) for n in names])
    above = conf >= teacher.threshold
    kept = above.copy()
    if teacher.balance_cap:
        for c in np.unique(cls[above]):
            idx = np.flatnonzero(above & (cls == c))
            order = idx[np.lexsort((idx, -conf[idx]))]  # most confident first, ties by position
            kept[order[teacher.balance_cap :]] = False
    hist, _ = np.histogram(np.clip(conf, 0, 1), bins=HIST_BINS, range=(0.0, 1.0))
    figures = {
        "teacher_samples": int(len(conf)),
        "kept": int(kept.sum()),
        "dropped_threshold": int((~above).sum()),
        "dropped_cap": int((above & ~kept).sum()),
        "threshold": teacher.threshold,
        "confidence_histogram": {
            "edges": [round(e, 2) for e in np.linspace(0, 1, HIST_BINS + 1)],
            "counts": [int(h) for h in hist],
        },  # fmt: skip
        "class_counts": {
            str(int(c)): int(n) for c, n in zip(*np.unique(cls[kept], return_counts=True), strict=True)
        },
        "mean_confidence": round(float(conf.mean()), 4),
    }
    rows = {n: np.sort(local[kept & (owner == i)]) for i, n in enumerate(names)}
    return rows, figures
