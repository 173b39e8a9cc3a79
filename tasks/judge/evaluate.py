"""Host-side evaluation of an inference ONNX model on a test set (``.npz`` with ``x`` and ``y``).

Runs an ONNX Runtime ``InferenceSession`` (the training package's runtime is fine on the host,
:mod:`tasks.judge.runtime`) and returns plain JSON-able metrics: the task's metrics
(classification and binary: accuracy, per-class precision and recall, the confusion matrix;
regression: mse and mae), the latency per sample and the model size, and ``loss``: the recipe's
training loss when given one (``loss=host_loss(recipe, prepared)``, see :mod:`tasks.judge.losses`),
named in ``loss_kind``, so promoting on ``loss`` compares the number the board minimised. Without
one the task's usual loss is used (cross-entropy, BCE-with-logits, mse).

The "base" model to compare a trained model against is :func:`base_inference_model`: the untrained
checkpoint turned into an inference graph by ONNX Runtime's own ``export_model_for_inferencing`` on
the *eval* graph - the very conversion the board applies after training - so before and after
differ by the trained weights only (``model.onnx`` itself is a training-mode export: BN uses batch
statistics, dropout is active, so it would understate the base).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import EvaluationError
from tasks.hashing import file_sha256
from tasks.judge.detection import detection_metrics
from tasks.judge.keypoints import keypoint_metrics
from tasks.judge.losses import (
    HostLoss,
    class_logits,
    keypoints_loss,
    l1_loss,
    loss_value,
    mse_loss,
    per_sample_loss,
    sample_losses,
    task_loss,
)
from tasks.judge.runtime import load_test_set, run_model, single_sample_latency_ms
from tasks.judge.segmentation import segmentation_metrics
from tasks.quiet import quiet_onnxruntime
from tasks.recipe.extras import DetectionSpec
from tasks.recipe.keypoints import KeypointsSpec
from tasks.recipe.schema import Recipe
from tasks.recipe.segmentation import SegmentationSpec

log = logging.getLogger(__name__)

EVAL_TASKS = ("classification", "binary", "regression", "segmentation", "keypoints", "embedded")
EVAL_CACHE_VERSION = 9  # bump when evaluate() changes what it reports


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
    """Accuracy, confusion matrix and per-class scores from logits (N, C)."""
    logits, labels = class_logits(logits, y)
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
    detection: DetectionSpec | None = None,
    priors: Path | None = None,
    segmentation: SegmentationSpec | None = None,
    keypoints: KeypointsSpec | None = None,
) -> dict[str, Any]:
    """Evaluate an inference model on a test set; returns JSON-able metrics (see module docstring).

    A detector (``detection`` and its ``priors`` file given) is also decoded and scored with COCO
    mAP (:mod:`tasks.judge.detection`) besides its embedded loss; a segmentation (task
    ``segmentation``, its ``[segmentation]`` table or the defaults) with mIoU, per-class IoU and
    pixel accuracy (:mod:`tasks.judge.segmentation`); keypoints (``keypoints``: the recipe's table) with
    OKS AP and PCK (:mod:`tasks.judge.keypoints`)."""
    if task not in EVAL_TASKS:
        raise EvaluationError(f"task: host evaluation supports {', '.join(EVAL_TASKS)}, got {task!r}")
    if batch_size < 1:
        raise EvaluationError(f"batch_size: expected an integer >= 1, got {batch_size}")
    model_onnx = Path(model_onnx)
    x, y = load_test_set(test_npz)
    if loss is None and task == "keypoints" and keypoints is not None:  # its targets need the input's size
        loss = keypoints_loss(keypoints, tuple(x.shape[-2:]))  # type: ignore[arg-type]
    loss = loss or task_loss(task)
    if detection is not None:
        if priors is None:
            raise EvaluationError("detection: the detector's priors file is needed to decode its boxes")
        metrics, spent, _ = detection_metrics(model_onnx, Path(test_npz), detection, priors)
        out = np.zeros(0)  # an embedded loss is computed by the eval graph, not from outputs
    else:
        out, spent = run_model(
            model_onnx, x, input_name=input_name, output_name=output_name, batch_size=batch_size
        )
        if task == "keypoints":
            if keypoints is None:
                raise EvaluationError("keypoints: the recipe's [keypoints] table is needed to judge them")
            metrics = keypoint_metrics(out, y, keypoints, tuple(x.shape[-2:]))  # type: ignore[arg-type]
        elif task == "segmentation":
            metrics = pixel_metrics(out, y, segmentation)
        else:
            metrics = TASK_METRICS[task](out, y)
    found = metrics.pop("per_sample", {})
    metrics["per_sample"] = {**per_sample(task, out, y), **found} if detection is None else {}
    if detection is not None:
        metrics["per_sample"]["detection"] = metrics.pop("matches")
    metrics["per_sample"]["loss"] = sample_losses(loss, model_onnx, Path(test_npz), out, y).round(8).tolist()
    metrics.update(
        loss=loss_value(loss, model_onnx, Path(test_npz), out, y, batch_size),
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


def pixel_metrics(out: np.ndarray, y: np.ndarray, spec: SegmentationSpec | None) -> dict[str, Any]:
    """A segmentation's metrics (:func:`tasks.judge.segmentation.segmentation_metrics`) by its table."""
    spec = spec or SegmentationSpec()
    names = spec.classes or tuple(str(c) for c in range(out.shape[1] if out.ndim > 1 else 0))
    return segmentation_metrics(out, y, names, spec.ignore_index, spec.background, spec.examples)


def per_sample(task: str, out: np.ndarray, y: np.ndarray) -> dict[str, list]:
    """Per-sample outcomes the promotion gate pairs between two models (tasks.judge.gate):
    ``correct`` (0/1) for classifiers, ``mse`` and ``mae`` for regression (``loss`` is added by
    :func:`evaluate` for every loss kind, ``detection`` holds a detector's matches per image)."""
    found: dict[str, list] = {}
    if task == "classification":
        logits, labels = class_logits(out, y)
        found["correct"] = (logits.argmax(axis=1) == labels).astype(int).tolist()
    elif task == "binary":
        found["correct"] = ((out.reshape(-1) > 0) == (y.reshape(-1) > 0.5)).astype(int).tolist()
    elif task == "regression":
        found["mse"] = per_sample_loss("mse", out, y).round(8).tolist()
        found["mae"] = per_sample_loss("l1", out, y).round(8).tolist()
    return found


def evaluate_cached(
    model_onnx: Path,
    test_npz: Path,
    task: str,
    cache_dir: Path,
    loss: HostLoss | None = None,
    detection: DetectionSpec | None = None,
    priors: Path | None = None,
    batch_size: int = 64,
    segmentation: SegmentationSpec | None = None,
    keypoints: KeypointsSpec | None = None,
) -> dict[str, Any]:
    """:func:`evaluate`, reusing the stored result for the same model bytes, test set bytes, task and loss.

    A nightly run evaluates the unchanged base and current models again; their metrics (and the
    latencies measured then) are taken from ``cache_dir`` instead. Only new models are run.
    """
    loss = loss or task_loss(task)
    detector = ""
    if detection is not None:
        detector = json.dumps(dataclasses.asdict(detection), default=str, sort_keys=True)
        detector += file_sha256(Path(priors)) if priors is not None and Path(priors).is_file() else ""
    if segmentation is not None:
        detector += json.dumps(dataclasses.asdict(segmentation), sort_keys=True)
    if keypoints is not None:
        detector += json.dumps(dataclasses.asdict(keypoints), sort_keys=True)
    key = hashlib.sha256(
        f"{EVAL_CACHE_VERSION}:{file_sha256(Path(model_onnx))}:{file_sha256(Path(test_npz))}:{task}:"
        f"{loss.cache_key()}:{detector}".encode()
    ).hexdigest()
    path = Path(cache_dir) / f"{key}.json"
    if path.is_file():
        log.info(
            "evaluation of %s on %s reused (same model and test set)",
            Path(model_onnx).name,
            Path(test_npz).name,
        )
        return json.loads(path.read_text())
    metrics = evaluate(model_onnx, test_npz, task, loss=loss, detection=detection, priors=priors,
                       batch_size=batch_size, segmentation=segmentation, keypoints=keypoints)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(metrics))
    os.replace(tmp, path)
    return metrics


def summary_line(metrics: dict[str, Any]) -> str:
    """One line of the headline metrics, for logs."""
    keys = ("accuracy", "map50", "map", "miou", "pixel_accuracy", "oks_ap", "pck", "loss", "mse", "mae",
            "latency_ms_batch1")  # fmt: skip
    line = ", ".join(f"{k}={metrics[k]:.4f}" for k in keys if k in metrics)
    return f"{line} (loss: {metrics['loss_kind']})" if "loss_kind" in metrics else line


def judged_as(recipe: Recipe, priors: Path | None = None) -> dict[str, Any]:
    """What :func:`evaluate` needs besides the task to judge ``recipe``'s model: a detector's table
    and priors, or a segmentation's or keypoints' table."""
    if recipe.detection is not None:
        return {"detection": recipe.detection, "priors": priors}
    if recipe.task == "segmentation":
        return {"segmentation": recipe.segmentation or SegmentationSpec()}
    if recipe.task == "keypoints":
        return {"keypoints": recipe.keypoints}
    return {}


def base_inference_model(
    training_model: Path,
    eval_model: Path,
    checkpoint: Path,
    output_names: list[str] | tuple[str, ...],
    out_path: Path,
) -> Path:
    """Export the untrained checkpoint as an inference model, exactly as the board does after training."""
    from onnxruntime.training.api import (  # ORT training (loads torch) only to export a checkpoint
        CheckpointState,
        Module,
    )

    quiet_onnxruntime()  # its default logger at errors: the eval graph's unused Dropout ratios warn otherwise
    try:
        state = CheckpointState.load_checkpoint(str(checkpoint))
        module = Module(str(training_model), state, str(eval_model), device="cpu")
        out_path.parent.mkdir(parents=True, exist_ok=True)
        module.export_model_for_inferencing(str(out_path), list(output_names))
    except Exception as exc:
        raise EvaluationError(f"cannot build the base inference model from {checkpoint}: {exc}") from exc
    return out_path
