"""Offline rehearsal of a recipe's ``[teacher]``: before anything reaches a board, the teacher must
load in the board's ONNX Runtime, answer ``[N, num_classes]`` on the host's test samples, and fit the
job's RAM budget together with training. Each refusal is one line naming the field.

It also writes what validation's training probe trains on (the test inputs with the labels the
teacher gives them, by the board's own code: :mod:`device_agent.teacher.labels`), so a distillation
loss is rehearsed on the soft targets the board will feed it, and measures the teacher's accuracy
on the test set (the report sets it beside the student's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from device_agent import detection as det
from device_agent.data.checks import np_dtype
from device_agent.errors import AgentError
from device_agent.protocol import BlobRef
from device_agent.teacher.boxes import detections
from device_agent.teacher.labels import log_probs, make_labels, select_rows
from device_agent.teacher_spec import TeacherSpec as WireTeacher
from tasks.errors import ValidationFailed
from tasks.prepare.feeds import DataSample, Feeds, graph_feeds
from tasks.prepare.onnx_versions import MAX_IR, MAX_OPSET
from tasks.prepare.sandbox.ort_parent import RunFailed, stop_if_interrupted
from tasks.prepare.sandbox.supervise import crash_line, graph_io, run_graph, supervised
from tasks.recipe.schema import Recipe
from tasks.recipe.teacher import label_keys

PROBE_ROWS = 256  # test rows the teacher answers on the host
BOARD_ORT = "ONNX Runtime 1.19.2"
MEASURE = r"""
import json, sys
import numpy as np
import onnxruntime as ort

def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return float(line.split()[1]) / 1024.0
cfg = json.loads(sys.argv[1])
base = rss("VmRSS:")
options = ort.SessionOptions()
options.log_severity_level = 3  # errors only
sess = ort.InferenceSession(cfg["model"], options, providers=["CPUExecutionProvider"])
arg = sess.get_inputs()[0]
x = np.load(cfg["data"])[cfg["input"]][: cfg["batch"]]
reps = -(-cfg["batch"] // max(1, len(x)))
inner = arg.type[len("tensor("):-1]  # float, double, float16, int64 (token ids), ...
x = np.concatenate([x] * reps)[: cfg["batch"]].astype({"float": "float32", "double": "float64"}.get(inner, inner))
sess.run(None, {arg.name: x})
print(json.dumps({"base_mb": base, "peak_mb": rss("VmHWM:")}))
"""


def fail(message: str) -> ValidationFailed:
    return ValidationFailed("teacher", message)


def wire_teacher(recipe: Recipe, sha256: str = "0" * 64, size: int = 0, num_classes: int = 0,
                 priors: BlobRef | None = None) -> WireTeacher:  # fmt: skip
    """The recipe's ``[teacher]`` as the job spec's (the board's) teacher."""
    t = recipe.teacher
    assert t is not None
    keys = label_keys(recipe)
    boxes = {"boxes_output": t.boxes_output, "iou_threshold": t.iou_threshold, "match_iou": t.match_iou,
             "max_boxes": t.max_boxes, "offsets_target": keys[1] if len(keys) > 1 else "offsets",
             "priors": priors or BlobRef("0" * 64, 0)} if t.labels == "boxes" else {}  # fmt: skip
    return WireTeacher(BlobRef(sha256, size), labels=t.labels, scores=t.scores, input=t.input, output=t.output,
                       target=keys[0], threshold=t.threshold, balance_cap=t.balance_cap, temperature=t.temperature,
                       batch_size=t.batch_size, num_classes=num_classes, **boxes)  # fmt: skip


def check_versions(path: Path) -> dict[str, int]:
    """The teacher's IR version and default-domain opset, refused when the board's ORT cannot load them."""
    if not path.is_file():
        raise fail(f"teacher.model: {path} does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf decode errors
        raise fail(f"teacher.model: {path.name} is not an ONNX model ({type(exc).__name__})") from exc
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset > MAX_OPSET:
        raise fail(f"teacher.model: {path.name} uses opset {opset}; the board's {BOARD_ORT} loads opsets up to "
                   f"{MAX_OPSET} (export it with opset_version <= {MAX_OPSET})")  # fmt: skip
    if model.ir_version > MAX_IR:
        raise fail(f"teacher.model: {path.name} has IR version {model.ir_version}; the board's {BOARD_ORT} loads "
                   f"up to {MAX_IR} (save it with onnx 1.16/1.17 or convert it)")  # fmt: skip
    return {"opset": opset, "ir_version": model.ir_version}


def _teacher_error(message: str) -> ValidationFailed:
    return fail(f"teacher.model: {message}")


def teacher_outputs(path: Path, x: np.ndarray, output: str, extra: tuple[str, ...] = ()) -> list[np.ndarray]:
    """The teacher's outputs ``output`` (or its first) and ``extra`` on ``x``, through the board's ORT
    version, in the validation stage's supervised child (a teacher that kills ORT is one line)."""
    with supervised("validation", error=_teacher_error):
        try:
            inputs, outs = graph_io(path)
        except RunFailed as exc:
            first = (exc.error.strip().splitlines() or ["no reason given"])[0]
            raise fail(f"teacher.model: {path.name} does not load in {BOARD_ORT}: {first[:300]}") from exc
        (arg, shape, kind), names = inputs[0], [output or outs[0], *extra]
        for field, name in zip(("output", "boxes_output"), names, strict=False):
            if name not in outs:
                raise fail(f"teacher.{field}: {name!r} is not an output of {path.name} (outputs: {outs})")
        want = [d if isinstance(d, int) else None for d in shape[1:]]
        if len(want) != x.ndim - 1 or any(
            w not in (None, g) for w, g in zip(want, x.shape[1:], strict=False)
        ):
            raise fail(f"teacher.model: its input {arg!r} is {shape}, the shards' samples are "
                       f"{list(x.shape[1:])}")  # fmt: skip
        dtype = np_dtype(kind)  # the input's own: float32 for images, int64 for token ids, ...
        try:
            parts = [run_graph(path, Feeds({arg: x[i : i + 64].astype(dtype)}, f"test samples {i}-{i + 63}"),
                               "running the teacher", names) for i in range(0, len(x), 64)]  # fmt: skip
        except RunFailed as exc:
            first = (exc.error.strip().splitlines() or ["no reason given"])[0]
            raise fail(f"teacher.model: inference on the test samples failed: {first[:300]}") from exc
    return [np.concatenate([p[name] for p in parts]) for name in names]


def measure_memory(path: Path, data: Path, input_key: str, batch: int) -> float:
    """MB the teacher adds to a process running it at ``batch`` rows (a torch-free subprocess)."""
    cfg = {"model": str(path), "data": str(data), "input": input_key, "batch": batch}
    proc = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(cfg)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    if proc.returncode < 0:
        raise fail(f"teacher.model: {_measure_died(proc.returncode, path, data, input_key, batch)}")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise fail(f"teacher.model: measuring its memory failed: {tail[:300]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return max(0.0, got["peak_mb"] - got["base_mb"])


def _measure_died(returncode: int, path: Path, data: Path, input_key: str, batch: int) -> str:
    """The one line for a memory measurement killed by a signal: the node of the teacher that dies on
    the same batch (a stop signal stops odl instead)."""
    stop_if_interrupted(returncode)
    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    arg = next(i.name for i in model.graph.input if i.name not in inits)
    with np.load(data, allow_pickle=False) as npz:
        sample = DataSample({input_key: npz[input_key][:batch]}, "data.test", {arg: input_key})
    feeds = graph_feeds(model, batch, sample)
    return crash_line(returncode, "validation", "measuring the teacher's memory", feeds, model)


def rehearse_teacher(
    recipe: Recipe, out_dir: Path, num_classes: int, margin: tuple[float, float]
) -> dict[str, Any]:
    """The teacher's checks but the RAM budget (:func:`check_budget`, once training's estimate is
    known); writes ``teacher_probe.npz`` (test inputs, the teacher's labels) for the training probe."""
    t = recipe.teacher
    assert t is not None and recipe.data.test is not None
    versions = check_versions(t.model)
    with np.load(recipe.data.test, allow_pickle=False) as npz:
        if t.input not in npz.files:
            raise fail(f"teacher.input: the test set {recipe.data.test.name} has no array {t.input!r} "
                       f"(has {sorted(npz.files)})")  # fmt: skip
        x, y = npz[t.input], (npz["y"] if "y" in npz.files else None)
    if t.labels == "boxes":
        return rehearse_boxes(recipe, out_dir, x, versions, margin)
    (out,) = teacher_outputs(t.model, x[:PROBE_ROWS] if y is None else x, t.output)
    if out.ndim != 2 or out.shape[1] != num_classes:
        raise fail(f"teacher.output: the teacher answers {list(out.shape)} for {len(out)} test samples; expected "
                   f"[N, {num_classes}] (the student's classes)")  # fmt: skip
    wire = wire_teacher(recipe, num_classes=num_classes)
    try:
        logp = log_probs(out, t.scores)
    except AgentError as exc:
        raise fail(str(exc)) from exc
    rows, figures = select_rows(wire, {"test": logp})
    teacher_mb = measure_memory(t.model, recipe.data.test, t.input, t.batch_size) * margin[0]
    probe = out_dir / "teacher_probe.npz"
    labels = make_labels(logp, wire)
    np.savez(probe, **{t.input: x[: len(labels)], label_keys(recipe)[0]: labels})  # the arrays the feeds read
    summary = {**versions, "output_shape": ["N", int(out.shape[1])], "teacher_mb": round(teacher_mb, 1),
               "ram_budget_mb": t.ram_budget_mb,
               "kept_share_on_test": round(len(rows["test"]) / len(logp), 4), "probe_data": probe.name}  # fmt: skip
    if y is not None:
        pred = logp.argmax(axis=1)
        summary["test_accuracy"] = round(float((pred == y.reshape(-1)).mean()), 4)
        kept = rows["test"]
        if len(kept):
            summary["kept_accuracy_on_test"] = round(float((pred[kept] == y.reshape(-1)[kept]).mean()), 4)
    summary["mean_confidence_on_test"] = figures["mean_confidence"]
    return summary


def check_budget(recipe: Recipe, summary: dict[str, Any], training_mb: float) -> None:
    """Refuse a teacher that does not fit the job's RAM budget together with training."""
    t = recipe.teacher
    assert t is not None
    teacher_mb = summary["teacher_mb"]
    total = training_mb + teacher_mb
    summary.update(training_mb=round(training_mb, 1), job_mb=round(total, 1))
    if total > t.ram_budget_mb:
        raise fail(f"teacher.ram_budget_mb: the teacher needs ~{teacher_mb:.0f} MB at batch {t.batch_size} and "
                   f"training ~{training_mb:.0f} MB: {total:.0f} MB > the budget {t.ram_budget_mb:.0f} MB")  # fmt: skip


def rehearse_boxes(recipe: Recipe, out_dir: Path, x: np.ndarray,
                   versions: dict[str, int], margin: tuple[float, float]) -> dict[str, Any]:  # fmt: skip
    """A detector teacher: scores ``[N, K, C + 1]`` and boxes ``[N, K, 4]`` on the test images, and
    its detections matched to the student's priors by the board's code (the probe trains on them);
    its mAP on the test set is the evaluation's (:func:`tasks.judge.detection.teacher_box_metrics`)."""
    t, spec = recipe.teacher, recipe.detection
    assert t is not None and spec is not None
    scores, boxes = teacher_outputs(t.model, x, t.output, (t.boxes_output,))
    want = len(spec.classes) + 1
    if scores.ndim != 3 or scores.shape[2] != want or boxes.shape != (*scores.shape[:2], 4):
        raise fail(f"teacher.output: the teacher answers scores {list(scores.shape)} and boxes {list(boxes.shape)} "
                   f"for {len(x)} test images; expected [N, K, {want}] (background + {len(spec.classes)} classes) "
                   "and [N, K, 4]")  # fmt: skip
    wire = wire_teacher(recipe)
    try:
        found = detections(scores, boxes, wire)
    except AgentError as exc:
        raise fail(str(exc)) from exc
    priors = np.load(out_dir / "priors.npy")
    confident = (found["labels"] >= 0) & (found["scores"] >= t.threshold)
    targets = [det.match(found["boxes"][i][confident[i]], found["labels"][i][confident[i]], priors, t.match_iou)
               for i in range(len(x))]  # fmt: skip
    keys = label_keys(recipe)
    probe = out_dir / "teacher_probe.npz"
    np.savez(probe, **{t.input: x, keys[0]: np.stack([c for c, _ in targets]),
                       keys[1]: np.stack([o for _, o in targets]).astype(np.float32)})  # fmt: skip
    summary = {**versions, "output_shape": ["N", int(scores.shape[1]), want], "probe_data": probe.name,
               "teacher_mb": round(measure_memory(t.model, recipe.data.test, t.input, t.batch_size) * margin[0], 1),
               "ram_budget_mb": t.ram_budget_mb, "kept_share_on_test": round(float(confident.any(axis=1).mean()), 4),
               "boxes_per_image_on_test": round(float(confident.sum(axis=1).mean()), 2)}  # fmt: skip
    return summary
