"""Host-side evaluation of an inference ONNX model on a test set (``.npz`` with ``x`` and ``y``).

Runs an ONNX Runtime ``InferenceSession`` (the training package's runtime is fine on the host) and
returns plain JSON-able metrics: the task's metrics (classification and binary: accuracy, per-class
precision and recall, the confusion matrix; regression: mse and mae), the latency per sample and
the model size, and ``loss``: the recipe's training loss (:class:`HostLoss`, named in
``loss_kind``), so promoting on ``loss`` compares the number the board minimised. The built-in
losses (``mse``, ``l1``, ``cross-entropy``, ``bce-with-logits``) are computed from the model's first
output as ``torch.nn.functional`` does (mean reduction); ``custom`` and ``embedded`` losses are the
prepared eval graph's (``artifacts/eval_model.onnx``) run with the evaluated model's weights. Without
a :class:`HostLoss` the task's usual loss is used (cross-entropy, BCE-with-logits, mse).

The "base" model to compare a trained model against is :func:`base_inference_model`: the untrained
checkpoint turned into an inference graph by ONNX Runtime's own ``export_model_for_inferencing`` on
the *eval* graph - the very conversion the board applies after training - so before and after
differ by the trained weights only (``model.onnx`` itself is a training-mode export: BN uses batch
statistics, dropout is active, so it would understate the base).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.errors import EvaluationError

if TYPE_CHECKING:
    from tasks.prepare import Prepared
    from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)

EVAL_TASKS = ("classification", "binary", "regression", "embedded")
LOSS_KINDS = ("mse", "cross-entropy", "bce-with-logits", "l1", "custom", "embedded")
GRAPH_LOSSES = ("custom", "embedded")  # computed by the prepared eval graph
TASK_LOSS = {"classification": "cross-entropy", "binary": "bce-with-logits", "regression": "mse"}
LATENCY_SAMPLES = 32
EVAL_CACHE_VERSION = 2  # bump when evaluate() changes what it reports


@dataclass(frozen=True)
class HostLoss:
    """The loss host evaluation reports as ``loss``: ``kind`` is one of :data:`LOSS_KINDS`.

    ``custom`` and ``embedded`` need the prepared eval graph (``eval_model``) and ``feeds``, the
    manifest's map of its data inputs to test-set arrays (eval-graph input -> npz key).
    """

    kind: str
    eval_model: Path | None = None
    feeds: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise EvaluationError(f"loss: expected one of {', '.join(LOSS_KINDS)}, got {self.kind!r}")
        if self.kind in GRAPH_LOSSES and (self.eval_model is None or not self.feeds):
            raise EvaluationError(f"loss {self.kind!r}: needs the eval graph and its feeds (host_loss)")

    def cache_key(self) -> str:
        """What the reported loss depends on besides the model and test set."""
        from device_agent.protocol import file_sha256

        graph = file_sha256(self.eval_model) if self.eval_model else "-"
        return f"{self.kind}:{graph}:{json.dumps(self.feeds, sort_keys=True)}"


def host_loss(recipe: Recipe, prep: Prepared) -> HostLoss:
    """The recipe's loss for :func:`evaluate`: its built-in kind, or the prepared eval graph."""
    kind = recipe.loss.kind
    if kind not in GRAPH_LOSSES:
        return HostLoss(kind)
    return HostLoss(kind, prep.artifacts_dir / "eval_model.onnx", dict(prep.manifest["feeds"]))


def task_loss(task: str) -> HostLoss:
    """The usual loss of a task, for callers that pass no :class:`HostLoss`."""
    if task not in TASK_LOSS:
        raise EvaluationError(
            f"task {task!r}: its loss is the eval graph's; pass loss=host_loss(recipe, prepared)"
        )
    return HostLoss(TASK_LOSS[task])


def _npz_arrays(path: Path, keys: list[str]) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise EvaluationError(f"test set {path}: file not found")
    with np.load(path) as data:
        for key in keys:
            if key not in data.files:
                raise EvaluationError(f"test set {path}: expected an array '{key}', found {data.files}")
        return {key: data[key] for key in keys}


def load_test_set(test_npz: Path, x_key: str = "x", y_key: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """Load the inputs and labels of a test set, naming the file and key when one is missing."""
    path = Path(test_npz)
    arrays = _npz_arrays(path, [x_key, y_key])
    x, y = arrays[x_key], arrays[y_key]
    if len(x) != len(y) or len(x) == 0:
        raise EvaluationError(
            f"test set {path}: expected as many labels as samples (> 0), got {len(x)} / {len(y)}"
        )
    return x, y


def _session(model_onnx: Path, model_bytes: bytes | None = None) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        source = str(model_onnx) if model_bytes is None else model_bytes
        return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own types (Fail, InvalidGraph, NoSuchFile...)
        raise EvaluationError(f"model {model_onnx}: ONNX Runtime cannot load it: {exc}") from exc


def _pick(names: list[str], wanted: str | None, what: str, model: Path) -> str:
    if wanted is None:
        return names[0]
    if wanted not in names:
        raise EvaluationError(f"model {model}: expected {what} '{wanted}', the graph has {names}")
    return wanted


def run_model(
    model_onnx: Path,
    x: np.ndarray,
    *,
    input_name: str | None = None,
    output_name: str | None = None,
    batch_size: int = 64,
) -> tuple[np.ndarray, float]:
    """Run the model over ``x`` in batches; return the stacked outputs and seconds spent in ``run``."""
    sess = _session(model_onnx)
    inp = _pick([i.name for i in sess.get_inputs()], input_name, "input", model_onnx)
    out = _pick([o.name for o in sess.get_outputs()], output_name, "output", model_onnx)
    x = np.asarray(x, dtype=np.float32)
    chunks, spent = [], 0.0
    for start in range(0, len(x), batch_size):
        t0 = time.perf_counter()
        chunks.append(sess.run([out], {inp: x[start : start + batch_size]})[0])
        spent += time.perf_counter() - t0
    return np.concatenate(chunks), spent


def single_sample_latency_ms(model_onnx: Path, x: np.ndarray, input_name: str | None = None) -> float:
    """Median latency of one-sample inference over the first samples of ``x``, in milliseconds."""
    sess = _session(model_onnx)
    inp = _pick([i.name for i in sess.get_inputs()], input_name, "input", model_onnx)
    x = np.asarray(x[:LATENCY_SAMPLES], dtype=np.float32)
    sess.run(None, {inp: x[:1]})  # warm-up
    times = []
    for i in range(len(x)):
        t0 = time.perf_counter()
        sess.run(None, {inp: x[i : i + 1]})
        times.append((time.perf_counter() - t0) * 1000.0)
    return float(np.median(times))


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> np.ndarray:
    """Counts ``cm[true, predicted]``."""
    cm = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(cm, (y_true.astype(np.int64), y_pred.astype(np.int64)), 1)
    return cm


def per_class(cm: np.ndarray) -> dict[str, list[float]]:
    """Precision and recall per class from a confusion matrix (0.0 where a class is never seen)."""
    diag = np.diag(cm).astype(np.float64)
    predicted, actual = cm.sum(axis=0), cm.sum(axis=1)
    precision = np.divide(diag, predicted, out=np.zeros_like(diag), where=predicted > 0)
    recall = np.divide(diag, actual, out=np.zeros_like(diag), where=actual > 0)
    return {"precision": precision.round(6).tolist(), "recall": recall.round(6).tolist()}


def _class_logits(logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Logits as (N, C) float64 and labels as int64 in [0, C), or an EvaluationError."""
    logits = logits.reshape(len(logits), -1).astype(np.float64)
    n_classes = logits.shape[1]
    labels = y.reshape(-1).astype(np.int64)
    if len(labels) != len(logits):
        raise EvaluationError(f"expected one label per sample, got {len(labels)} for {len(logits)} logits")
    if labels.min() < 0 or labels.max() >= n_classes:
        raise EvaluationError(
            f"labels must lie in [0, {n_classes - 1}] for {n_classes} logits, "
            f"got {labels.min()}..{labels.max()}"
        )
    return logits, labels


def _paired(pred: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prediction and target as (N, k) float64 arrays of one shape, or an EvaluationError."""
    p = pred.astype(np.float64).reshape(len(pred), -1)
    t = y.astype(np.float64).reshape(len(y), -1)
    if p.shape != t.shape:
        raise EvaluationError(f"prediction shape {p.shape} != target shape {t.shape}")
    return p, t


def mse_loss(pred: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error over every element (``torch.nn.functional.mse_loss``)."""
    p, t = _paired(pred, y)
    return float(((p - t) ** 2).mean())


def l1_loss(pred: np.ndarray, y: np.ndarray) -> float:
    """Mean absolute error over every element (``torch.nn.functional.l1_loss``)."""
    p, t = _paired(pred, y)
    return float(np.abs(p - t).mean())


def bce_with_logits_loss(logits: np.ndarray, y: np.ndarray) -> float:
    """Mean BCE on logits, computed stably (``binary_cross_entropy_with_logits``)."""
    z, t = _paired(logits, y)
    return float((np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))).mean())


def cross_entropy_loss(logits: np.ndarray, y: np.ndarray) -> float:
    """Mean softmax cross-entropy of class labels, via a stable log-softmax (``cross_entropy``)."""
    logits, labels = _class_logits(logits, y)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(labels)), labels].mean())


BUILTIN_LOSSES: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "mse": mse_loss,
    "l1": l1_loss,
    "bce-with-logits": bce_with_logits_loss,
    "cross-entropy": cross_entropy_loss,
}


def eval_graph_loss(
    eval_model: Path, model_onnx: Path, arrays: dict[str, np.ndarray], batch_size: int = 64
) -> float:
    """The eval graph's loss (its first output) with the weights of ``model_onnx``, over ``arrays``.

    The eval graph takes every parameter as an input (the board feeds them from its checkpoint);
    here they become initializers holding the inference model's tensors of the same names, the
    trained weights of a retrieved model. ``arrays`` feed its other inputs (name -> all samples);
    batch losses are weighted by batch size, as the board's eval step does.
    """
    import onnx

    graph = onnx.load(str(eval_model))
    weights = {t.name: t for t in onnx.load(str(model_onnx)).graph.initializer}
    params = [i for i in graph.graph.input if i.name in weights]
    for inp in params:
        graph.graph.input.remove(inp)
        graph.graph.initializer.append(weights[inp.name])
    dtypes = {i.name: _np_dtype(i) for i in graph.graph.input}
    missing = sorted(set(dtypes) - set(arrays))
    if missing:
        raise EvaluationError(
            f"eval graph {eval_model}: no value for its inputs {missing} "
            f"(neither a weight of {Path(model_onnx).name} nor a test-set array)"
        )
    sess = _session(Path(eval_model), graph.SerializeToString())
    loss_name = sess.get_outputs()[0].name
    n, total = len(next(iter(arrays.values()))), 0.0
    for start in range(0, n, batch_size):
        end = min(n, start + batch_size)
        feed = {k: np.ascontiguousarray(arrays[k][start:end], dt) for k, dt in dtypes.items()}
        total += float(np.asarray(sess.run([loss_name], feed)[0]).reshape(-1)[0]) * (end - start)
    return total / n


def _np_dtype(value_info: Any) -> np.dtype:
    from onnx.helper import tensor_dtype_to_np_dtype

    return tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type)


def _loss_value(
    loss: HostLoss, model_onnx: Path, test_npz: Path, out: np.ndarray, y: np.ndarray, batch_size: int
) -> float:
    if loss.kind not in GRAPH_LOSSES:
        return BUILTIN_LOSSES[loss.kind](out, y)
    assert loss.eval_model is not None  # HostLoss checks it
    arrays = _npz_arrays(test_npz, sorted(set(loss.feeds.values())))
    feeds = {name: arrays[key] for name, key in loss.feeds.items()}
    return eval_graph_loss(loss.eval_model, model_onnx, feeds, batch_size)


def classification_metrics(logits: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Accuracy, confusion matrix and per-class scores from logits (N, C)."""
    logits, labels = _class_logits(logits, y)
    pred = logits.argmax(axis=1)
    cm = confusion_matrix(labels, pred, logits.shape[1])
    return {
        "accuracy": float((pred == labels).mean()),
        "confusion_matrix": cm.tolist(),
        "per_class": per_class(cm),
    }


def binary_metrics(logits: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Accuracy, 2x2 confusion matrix and per-class scores from one logit per sample."""
    z = logits.reshape(-1).astype(np.float64)
    t = y.reshape(-1).astype(np.float64)
    if len(z) != len(t):
        raise EvaluationError(
            f"binary task: expected one logit per sample, got {logits.shape} for {len(t)} labels"
        )
    pred = (z > 0).astype(np.int64)
    cm = confusion_matrix((t > 0.5).astype(np.int64), pred, 2)
    return {
        "accuracy": float((pred == (t > 0.5)).mean()),
        "confusion_matrix": cm.tolist(),
        "per_class": per_class(cm),
    }


def regression_metrics(pred: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Mean squared and absolute error."""
    return {"mse": mse_loss(pred, y), "mae": l1_loss(pred, y)}


TASK_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], dict[str, Any]]] = {
    "classification": classification_metrics,
    "binary": binary_metrics,
    "regression": regression_metrics,
    "embedded": lambda out, y: {},  # the model's outputs mean what its author says: loss only
}


def evaluate(
    model_onnx: Path,
    test_npz: Path,
    task: str,
    *,
    loss: HostLoss | None = None,
    input_name: str | None = None,
    output_name: str | None = None,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Evaluate an inference model on a test set; returns JSON-able metrics (see module docstring)."""
    if task not in EVAL_TASKS:
        raise EvaluationError(f"task: host evaluation supports {', '.join(EVAL_TASKS)}, got {task!r}")
    if batch_size < 1:
        raise EvaluationError(f"batch_size: expected an integer >= 1, got {batch_size}")
    loss = loss or task_loss(task)
    model_onnx = Path(model_onnx)
    x, y = load_test_set(test_npz)
    out, spent = run_model(
        model_onnx, x, input_name=input_name, output_name=output_name, batch_size=batch_size
    )
    metrics = TASK_METRICS[task](out, y)
    metrics.update(
        loss=_loss_value(loss, model_onnx, Path(test_npz), out, y, batch_size),
        loss_kind=loss.kind,
        task=task,
        samples=len(x),
        test_set=Path(test_npz).name,
        latency_ms_per_sample=round(spent / len(x) * 1000.0, 6),
        latency_ms_batch1=round(single_sample_latency_ms(model_onnx, x, input_name), 6),
        model_size_bytes=model_onnx.stat().st_size,
    )
    log.info("evaluated %s on %s: %s", model_onnx.name, metrics["test_set"], summary_line(metrics))
    return metrics


def evaluate_cached(
    model_onnx: Path, test_npz: Path, task: str, cache_dir: Path, loss: HostLoss | None = None
) -> dict[str, Any]:
    """:func:`evaluate`, reusing the stored result for the same model bytes, test set bytes, task and loss.

    A nightly run evaluates the unchanged base and current models again; their metrics (and the
    latencies measured then) are taken from ``cache_dir`` instead. Only new models are run.
    """
    from device_agent.protocol import file_sha256

    loss = loss or task_loss(task)
    key = hashlib.sha256(
        f"{EVAL_CACHE_VERSION}:{file_sha256(Path(model_onnx))}:{file_sha256(Path(test_npz))}:{task}:"
        f"{loss.cache_key()}".encode()
    ).hexdigest()
    path = Path(cache_dir) / f"{key}.json"
    if path.is_file():
        log.info(
            "evaluation of %s on %s reused (same model and test set)",
            Path(model_onnx).name,
            Path(test_npz).name,
        )
        return json.loads(path.read_text())
    metrics = evaluate(model_onnx, test_npz, task, loss=loss)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(metrics))
    os.replace(tmp, path)
    return metrics


def summary_line(metrics: dict[str, Any]) -> str:
    """One line of the headline metrics, for logs."""
    keys = ("accuracy", "loss", "mse", "mae", "latency_ms_batch1")
    line = ", ".join(f"{k}={metrics[k]:.4f}" for k in keys if k in metrics)
    return f"{line} (loss: {metrics['loss_kind']})" if "loss_kind" in metrics else line


def base_inference_model(
    training_model: Path,
    eval_model: Path,
    checkpoint: Path,
    output_names: list[str] | tuple[str, ...],
    out_path: Path,
) -> Path:
    """Export the untrained checkpoint as an inference model, exactly as the board does after training."""
    from onnxruntime.training.api import CheckpointState, Module

    try:
        state = CheckpointState.load_checkpoint(str(checkpoint))
        module = Module(str(training_model), state, str(eval_model), device="cpu")
        out_path.parent.mkdir(parents=True, exist_ok=True)
        module.export_model_for_inferencing(str(out_path), list(output_names))
    except Exception as exc:
        raise EvaluationError(f"cannot build the base inference model from {checkpoint}: {exc}") from exc
    return out_path
