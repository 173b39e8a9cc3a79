"""One job from job.json to result.json: checks, resume, training, export, result.

``run_job`` is idempotent on the job: a finished job (or one that failed for a reason that
retrying cannot fix) returns its stored result; an interrupted or cancelled one resumes from its
last checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device_agent.atomic import atomic_write
from device_agent.data.checks import check_dataset, model_io, np_dtype
from device_agent.data.datasets import ShardDataset, dataset_files, folder_dataset, verify_files
from device_agent.data.prefix_cache import RAM_SHARE, PrefixCache, open_prefix
from device_agent.data.readers import ImageFolderDataset, InputSpec, NpzDataset
from device_agent.errors import AgentError
from device_agent.job.batch_mark import BatchMarker
from device_agent.job.checkpoints import Progress, latest_checkpoint, write_state
from device_agent.job.events import EventLog
from device_agent.job.jobdir import JobDir, check_resources, read_result, verify_inputs
from device_agent.job.trainer import Cancelled, Session, Trainer
from device_agent.privacy import START_FILE, load_arrays, privatize, save_arrays
from device_agent.protocol import NEVER_RETRY, DataRef, ExitCode, FileRef, JobResult, JobSpec, file_sha256
from device_agent.runtimes import open_runtime
from device_agent.sysinfo import meminfo_mb, peak_rss_mb, versions
from device_agent.teacher.boxes import box_shards
from device_agent.teacher.labels import teacher_shards

log = logging.getLogger(__name__)


def stored_outcome(job: JobDir) -> JobResult | None:
    """The result of a job that must not train again (finished, or failed for good)."""
    res = read_result(job)
    if res is None:
        return None
    if res.status == "finished" or (res.status == "failed" and res.exit_code in NEVER_RETRY):
        return res
    return None


def run_job(job: JobDir, spec: JobSpec) -> JobResult:
    """Train (or resume) the job and write result.json; failures are written as results too."""
    done = stored_outcome(job)
    if done is not None:
        log.info("job %s already %s: returning its result", spec.job_id, done.status)
        return done
    job.result_file.unlink(missing_ok=True)
    events = EventLog(job.events, spec.job_id)
    marker = BatchMarker(job.batch_file)
    marker.mark("open", 0, 0)  # a death before the first step is not blamed on an earlier run's batch
    t0 = time.time()
    trainer: Trainer | None = None
    progress = Progress()
    try:
        trainer, progress, teacher = _prepare(job, spec, events, marker)
        _install_sigterm(trainer)
        trainer.train(progress)
        marker.mark("finish", progress.step, progress.epoch)
        result = dataclasses.replace(_finish(job, spec, trainer, progress, t0), teacher=teacher)
        events.emit("finished", steps=result.steps, metrics=result.metrics, duration_s=result.duration_s)
    except Cancelled as exc:
        result = _result(spec, "cancelled", ExitCode.CANCELLED, progress, t0, error=str(exc))
        events.emit("cancelled", step=progress.step, epoch=progress.epoch)
    except AgentError as exc:
        result = _result(spec, "failed", exc.code, progress, t0, error=str(exc))
        events.emit("failed", step=progress.step, **exc.to_dict())
    except Exception as exc:  # noqa: BLE001 - ORT raises RuntimeError, Fail, InvalidArgument...
        log.exception("runtime error")
        result = _result(
            spec, "failed", ExitCode.RUNTIME_ERROR, progress, t0, error=f"{type(exc).__name__}: {exc}"
        )
        events.emit("failed", step=progress.step, exit_code=int(ExitCode.RUNTIME_ERROR), error=result.error)
    finally:
        events.close()
        marker.close()
    atomic_write(job.result_file, result.to_json())
    return result


@dataclass
class OpenJob:
    """A job's ORT session and datasets, checked and ready for the first (or next) step."""

    session: Session
    train_ds: Any
    eval_ds: Any
    progress: Progress
    resumed: bool
    num_classes: int | None
    data_inputs: list  # what the data must hold: the model's inputs (a split job: the prefix's)
    # the teacher's labels: counts, confidence histogram, classes, timing ({} without a teacher)
    teacher: dict[str, Any]


def open_job(job: JobDir, spec: JobSpec, events: EventLog | None = None) -> OpenJob:
    """Verify blobs and resources, load the artifacts (or the last checkpoint), check the data."""
    paths = verify_inputs(job, spec)
    check_resources(job, spec)
    resume = latest_checkpoint(job.checkpoints)
    opened = open_runtime(spec.runtime, paths, resume or paths["checkpoint"])
    state, module = opened.state, opened.module
    names = list(module.input_names())
    inputs, classes = model_io(opened.eval_graph, names)
    classes = spec.num_classes or classes
    prefix = None
    data_names, data_inputs = names, inputs
    if spec.prefix is not None:  # the data feeds the prefix; the module reads its output instead
        prefix, data_inputs = _prefix_inputs(paths["prefix_model"], spec, inputs)
        data_names = [i.name for i in data_inputs]
    teacher: dict[str, Any] = {}
    if spec.teacher is not None:  # the unlabeled shards get the teacher's labels first
        train_ds, teacher = _taught(spec, paths, data_names, classes or 0, events)
    else:
        train_ds = _dataset(spec.train_data, paths["train_data"], data_names, data_inputs, spec, "train_data")
    eval_ds = None
    if spec.eval_data is not None:
        eval_ds = _dataset(spec.eval_data, paths["eval_data"], data_names, data_inputs, spec, "eval_data")
    for shard in getattr(train_ds, "shards", ()):  # every shard checked in full, then the whole
        check_dataset(shard, data_inputs, spec.task, classes, shard.field, spec.ignore_index)
    check_dataset(train_ds, data_inputs, spec.task, classes, "train_data", spec.ignore_index)
    if eval_ds is not None:
        check_dataset(eval_ds, data_inputs, spec.task, classes, "eval_data", spec.ignore_index)
    if prefix is not None:
        train_ds, eval_ds = _cached(job, spec, prefix, names, train_ds, eval_ds, events)
    progress = Progress.from_properties(state.properties) if resume else Progress()
    session = Session(opened.api, state, module, opened.optimizer, inputs, opened.seeder)
    return OpenJob(session, train_ds, eval_ds, progress, resume is not None, classes, data_inputs, teacher)


def _taught(spec: JobSpec, paths: dict[str, Path], names: list[str], classes: int,
            events: EventLog | None) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """The train shards with the teacher's labels on the unlabeled ones, and the labels' figures."""
    assert spec.teacher is not None
    ref, folder = spec.train_data, paths["train_data"]
    if ref.format != "npz-shards":
        raise AgentError(ExitCode.INVALID_SPEC, f"teacher: labels npz-shards datasets only (train_data is {ref.format})",
                         "teacher")  # fmt: skip
    files = (
        verify_files(folder, ref, "train_data")
        if ref.files
        else [folder / n for n in dataset_files(folder, ref.format)[0]]
    )
    if not files:
        raise AgentError(ExitCode.DATA_MISMATCH, f"train_data: no files in {folder}", "train_data")
    if spec.teacher.labels == "boxes":  # a detector teacher: its boxes matched to the student's priors
        got = box_shards(paths["teacher_model"], spec.teacher, folder, files, names, spec.feeds,
                         paths["teacher_priors"], events, "train_data")  # fmt: skip
    else:
        got = teacher_shards(paths["teacher_model"], spec.teacher, folder, files, names, spec.feeds, classes,
                             events, "train_data")  # fmt: skip
    return ShardDataset(files, names, spec.feeds, "train_data", shards=got.shards), got.figures


def _prefix_inputs(path: Path, spec: JobSpec, inputs: list) -> tuple[Any, list]:
    """The prefix session, and the inputs the data must hold: the prefix's, then the module's others."""
    assert spec.prefix is not None
    sess = open_prefix(path, spec.prefix)
    first = [InputSpec.of(i.name, i.shape, np_dtype(i.type)) for i in sess.get_inputs()]
    return sess, first + [i for i in inputs if i.name != spec.prefix.output]


def _cached(job: JobDir, spec: JobSpec, sess: Any, names: list[str], train_ds: Any, eval_ds: Any,
            events: EventLog | None) -> tuple[Any, Any]:  # fmt: skip
    assert spec.prefix is not None
    rest = [n for n in names if n != spec.prefix.output]
    budget = RAM_SHARE * max(0.0, meminfo_mb()["available_mb"] - spec.memory_estimate_mb)
    kw = {"batch": spec.train.batch_size, "events": events}
    train = PrefixCache(train_ds, sess, spec.prefix, rest, budget_mb=0.8 * budget, spill=job.path / "prefix-train.npy",
                        field="train_data", **kw)  # fmt: skip
    if eval_ds is not None:
        eval_ds = PrefixCache(eval_ds, sess, spec.prefix, rest, budget_mb=0.2 * budget,
                              spill=job.path / "prefix-eval.npy", field="eval_data", **kw)  # fmt: skip
    return train, eval_ds


def _prepare(job: JobDir, spec: JobSpec, events: EventLog,
             marker: BatchMarker) -> tuple[Trainer, Progress, dict[str, Any]]:  # fmt: skip
    opened = open_job(job, spec, events)
    if spec.privacy is not None and not opened.resumed:  # local DP: the update is measured from here
        save_arrays(job.path / START_FILE, _trainable_arrays(opened.session.state))
    progress = opened.progress
    trainer = Trainer(job, spec, opened.session, opened.train_ds, opened.eval_ds, events, marker)
    events.emit("started", resumed_from_step=progress.step if opened.resumed else None, total_steps=trainer.total,
                steps_per_epoch=trainer.spe, train_samples=len(opened.train_ds), pid=os.getpid(),
                eval_samples=len(opened.eval_ds) if opened.eval_ds is not None else 0,
                **({"teacher": opened.teacher} if opened.teacher else {}))  # fmt: skip
    return trainer, progress, opened.teacher


def _dataset(ref: DataRef, path: Path, names: list[str], inputs: list, spec: JobSpec, field: str) -> Any:
    if ref.format == "npz":
        return NpzDataset(path, names, spec.feeds, field)
    if ref.format == "npz-shards" or ref.files is not None:
        return folder_dataset(ref, path, names, inputs, spec.feeds, field)
    return ImageFolderDataset(path, inputs, field)


def _install_sigterm(trainer: Trainer) -> None:
    def handler(signum: int, frame: object) -> None:
        trainer.cancel_flag = True

    signal.signal(signal.SIGTERM, handler)


def _finish(job: JobDir, spec: JobSpec, trainer: Trainer, progress: Progress, t0: float) -> JobResult:
    if spec.privacy is not None:
        return _finish_private(job, spec, trainer, progress, t0)
    sess = trainer.sess
    inference = job.path / "inference.onnx"
    tmp = job.path / "inference.onnx.tmp"
    try:
        sess.module.export_model_for_inferencing(str(tmp), list(spec.output_names))
    except Exception as exc:  # noqa: BLE001
        raise AgentError(
            ExitCode.RUNTIME_ERROR, f"export_model_for_inferencing({list(spec.output_names)}) failed: {exc}"
        ) from exc
    os.replace(tmp, inference)
    write_state(sess.api, sess.state, job.checkpoints / "final")
    trainable = _write_trainable(sess.state, job.path / "trainable.npz")
    outputs = {
        name: _file_ref(job, p)
        for name, p in (
            ("inference", inference),
            ("checkpoint", job.checkpoints / "final"),
            ("trainable", trainable),
        )
    }
    return _result(spec, "finished", ExitCode.OK, progress, t0, outputs=outputs)


def _finish_private(job: JobDir, spec: JobSpec, trainer: Trainer, progress: Progress, t0: float) -> JobResult:
    """Local differential privacy (``spec.privacy``): ``trainable.npz``, the one output, holds the
    start plus the clipped, noised update; no inference model is exported and the checkpoints of
    the raw weights are removed, so nothing raw can be fetched from the job."""
    assert spec.privacy is not None
    start = load_arrays(job.path / START_FILE)
    noised = privatize(start, _trainable_arrays(trainer.sess.state), spec.privacy, np.random.default_rng())
    trainable = save_arrays(job.path / "trainable.npz", noised)
    shutil.rmtree(job.checkpoints, ignore_errors=True)
    return _result(
        spec, "finished", ExitCode.OK, progress, t0, outputs={"trainable": _file_ref(job, trainable)}
    )


def _trainable_arrays(state: Any) -> dict[str, np.ndarray]:
    """The trained parameters only (name -> array)."""
    return {name: np.asarray(p.data) for name, p in state.parameters if p.requires_grad}


def _write_trainable(state: Any, path: Path) -> Path:
    """``trainable.npz``: the trained parameters only, what a fleet averages; the host fetches it
    instead of the whole checkpoint or model."""
    return save_arrays(path, _trainable_arrays(state))


def _file_ref(job: JobDir, path: Path) -> FileRef:
    return FileRef(str(path.relative_to(job.path)), file_sha256(path), path.stat().st_size)


def _result(spec: JobSpec, status: str, code: int, progress: Progress, t0: float, error: str = "",
            outputs: dict[str, FileRef] | None = None) -> JobResult:  # fmt: skip
    metrics = {
        k: v
        for k, v in (progress.history[-1] if progress.history else {}).items()
        if k not in ("epoch", "step")
    }
    return JobResult(
        job_id=spec.job_id, status=status, exit_code=int(code), steps=progress.step,
        epochs_done=progress.epoch, duration_s=round(time.time() - t0, 3),
        train_loop_s=round(progress.train_loop_s, 4), peak_rss_mb=peak_rss_mb(), metrics=metrics,
        history=progress.history, outputs=outputs or {}, error=error, versions=versions(),
    )  # fmt: skip
