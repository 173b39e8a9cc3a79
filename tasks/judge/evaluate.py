"""Host-side evaluation of an inference ONNX model on a test set (``.npz`` with ``x`` and ``y``).

Runs an ONNX Runtime ``InferenceSession`` (the training package's runtime is fine on the host) and
returns plain JSON-able metrics: accuracy, loss (cross-entropy / BCE-with-logits), per-class
precision and recall, the confusion matrix, latency per sample and model size; regression gives
mse/mae (``loss`` = mse).

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
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import EvaluationError

log = logging.getLogger(__name__)

EVAL_TASKS = ("classification", "binary", "regression")
LATENCY_SAMPLES = 32
EVAL_CACHE_VERSION = 1  # bump when evaluate() changes what it reports


def load_test_set(test_npz: Path, x_key: str = "x", y_key: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """Load the inputs and labels of a test set, naming the file and key when one is missing."""
    path = Path(test_npz)
    if not path.is_file():
        raise EvaluationError(f"test set {path}: file not found")
    with np.load(path) as data:
        for key in (x_key, y_key):
            if key not in data.files:
                raise EvaluationError(f"test set {path}: expected an array '{key}', found {data.files}")
        x, y = data[x_key], data[y_key]
    if len(x) != len(y) or len(x) == 0:
        raise EvaluationError(
            f"test set {path}: expected as many labels as samples (> 0), got {len(x)} / {len(y)}"
        )
    return x, y


def _session(model_onnx: Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(model_onnx), opts, providers=["CPUExecutionProvider"])
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


def classification_metrics(logits: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Accuracy, mean softmax cross-entropy, confusion matrix and per-class scores from logits (N, C)."""
    logits = logits.reshape(len(logits), -1).astype(np.float64)
    n_classes = logits.shape[1]
    y = y.reshape(-1).astype(np.int64)
    if y.min() < 0 or y.max() >= n_classes:
        raise EvaluationError(
            f"labels must lie in [0, {n_classes - 1}] for {n_classes} logits, got {y.min()}..{y.max()}"
        )
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    pred = logits.argmax(axis=1)
    cm = confusion_matrix(y, pred, n_classes)
    return {
        "accuracy": float((pred == y).mean()),
        "loss": float(-log_probs[np.arange(len(y)), y].mean()),
        "confusion_matrix": cm.tolist(),
        "per_class": per_class(cm),
    }


def binary_metrics(logits: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Accuracy, mean BCE-with-logits, 2x2 confusion matrix and per-class scores from one logit per sample."""
    z = logits.reshape(-1).astype(np.float64)
    t = y.reshape(-1).astype(np.float64)
    if len(z) != len(t):
        raise EvaluationError(
            f"binary task: expected one logit per sample, got {logits.shape} for {len(t)} labels"
        )
    loss = np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))
    pred = (z > 0).astype(np.int64)
    cm = confusion_matrix((t > 0.5).astype(np.int64), pred, 2)
    return {
        "accuracy": float((pred == (t > 0.5)).mean()),
        "loss": float(loss.mean()),
        "confusion_matrix": cm.tolist(),
        "per_class": per_class(cm),
    }


def regression_metrics(pred: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Mean squared and absolute error; ``loss`` is the mse."""
    pred = pred.astype(np.float64).reshape(len(y), -1)
    target = y.astype(np.float64).reshape(len(y), -1)
    if pred.shape != target.shape:
        raise EvaluationError(
            f"regression task: prediction shape {pred.shape} != target shape {target.shape}"
        )
    mse = float(((pred - target) ** 2).mean())
    return {"mse": mse, "mae": float(np.abs(pred - target).mean()), "loss": mse}


def evaluate(
    model_onnx: Path,
    test_npz: Path,
    task: str,
    *,
    input_name: str | None = None,
    output_name: str | None = None,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Evaluate an inference model on a test set; returns JSON-able metrics (see module docstring)."""
    if task not in EVAL_TASKS:
        raise EvaluationError(f"task: host evaluation supports {', '.join(EVAL_TASKS)}, got {task!r}")
    if batch_size < 1:
        raise EvaluationError(f"batch_size: expected an integer >= 1, got {batch_size}")
    model_onnx = Path(model_onnx)
    x, y = load_test_set(test_npz)
    out, spent = run_model(
        model_onnx, x, input_name=input_name, output_name=output_name, batch_size=batch_size
    )
    scorer = {
        "classification": classification_metrics,
        "binary": binary_metrics,
        "regression": regression_metrics,
    }
    metrics = scorer[task](out, y)
    metrics.update(
        task=task,
        samples=len(x),
        test_set=Path(test_npz).name,
        latency_ms_per_sample=round(spent / len(x) * 1000.0, 6),
        latency_ms_batch1=round(single_sample_latency_ms(model_onnx, x, input_name), 6),
        model_size_bytes=model_onnx.stat().st_size,
    )
    log.info("evaluated %s on %s: %s", model_onnx.name, metrics["test_set"], summary_line(metrics))
    return metrics


def evaluate_cached(model_onnx: Path, test_npz: Path, task: str, cache_dir: Path) -> dict[str, Any]:
    """:func:`evaluate`, reusing the stored result for the same model bytes, test set bytes and task.

    A nightly run evaluates the unchanged base and current models again; their metrics (and the
    latencies measured then) are taken from ``cache_dir`` instead. Only new models are run.
    """
    from device_agent.protocol import file_sha256

    key = hashlib.sha256(
        f"{EVAL_CACHE_VERSION}:{file_sha256(Path(model_onnx))}:{file_sha256(Path(test_npz))}:{task}".encode()
    ).hexdigest()
    path = Path(cache_dir) / f"{key}.json"
    if path.is_file():
        log.info(
            "evaluation of %s on %s reused (same model and test set)",
            Path(model_onnx).name,
            Path(test_npz).name,
        )
        return json.loads(path.read_text())
    metrics = evaluate(model_onnx, test_npz, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(metrics))
    os.replace(tmp, path)
    return metrics


def summary_line(metrics: dict[str, Any]) -> str:
    """One line of the headline metrics, for logs."""
    keys = ("accuracy", "loss", "mse", "mae", "latency_ms_batch1")
    return ", ".join(f"{k}={metrics[k]:.4f}" for k in keys if k in metrics)


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
