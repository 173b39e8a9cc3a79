"""The loss host evaluation reports as ``loss``: the recipe's own training loss, named in ``loss_kind``.

Promoting on ``loss`` must compare the number the board minimised, so :func:`host_loss` turns a
recipe's ``[loss]`` into a :class:`HostLoss`. The built-in losses (``mse``, ``l1``,
``cross-entropy``, ``bce-with-logits``) are computed from the model's first output as
``torch.nn.functional`` does (mean reduction); ``custom`` and ``embedded`` losses are the prepared
eval graph's (``artifacts/eval_model.onnx``) run with the evaluated model's weights
(:func:`eval_graph_loss`). Callers without a recipe get the task's usual loss (:func:`task_loss`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from device_agent.runtimes.weights import whole_model
from tasks.errors import EvaluationError
from tasks.hashing import file_sha256
from tasks.judge.keypoints import keypoint_losses
from tasks.judge.runtime import npz_arrays, session
from tasks.judge.segmentation_losses import image_losses, loss_sums, set_loss
from tasks.prepare import graph_file
from tasks.recipe.segmentation import segmentation_of

if TYPE_CHECKING:
    from tasks.prepare import Prepared
    from tasks.recipe.keypoints import KeypointsSpec
    from tasks.recipe.schema import Recipe

PIXEL_LOSSES = ("pixel-cross-entropy", "dice", "pixel-cross-entropy+dice")  # a segmentation's recipe losses
KEYPOINTS_LOSS = "keypoints-mse"  # task keypoints' mse: heatmaps against Gaussian targets, or coordinates
LOSS_KINDS = ("mse", "cross-entropy", "bce-with-logits", "l1", *PIXEL_LOSSES, KEYPOINTS_LOSS, "custom",
              "embedded")  # fmt: skip
GRAPH_LOSSES = ("custom", "embedded")  # computed by the prepared eval graph
TASK_LOSS = {"classification": "cross-entropy", "binary": "bce-with-logits", "regression": "mse",
             "segmentation": "pixel-cross-entropy"}  # fmt: skip


@dataclass(frozen=True)
class HostLoss:
    """The loss host evaluation reports as ``loss``: ``kind`` is one of :data:`LOSS_KINDS`.

    ``custom`` and ``embedded`` need the prepared eval graph (``eval_model``) and ``feeds``, the
    manifest's map of its data inputs to test-set arrays (eval-graph input -> npz key).
    """

    kind: str
    eval_model: Path | None = None
    feeds: dict[str, str] = field(default_factory=dict)
    ignore_index: int = 255  # PIXEL_LOSSES: the label of pixels no loss counts
    dice_weight: float = 1.0  # pixel-cross-entropy+dice: Dice's weight
    heatmap_sigma: float = 2.0  # keypoints-mse: the Gaussian targets' sigma in heatmap cells
    input_hw: tuple[int, int] = (0, 0)  # keypoints-mse: the input image's height and width

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise EvaluationError(f"loss: expected one of {', '.join(LOSS_KINDS)}, got {self.kind!r}")
        if self.kind in GRAPH_LOSSES and (self.eval_model is None or not self.feeds):
            raise EvaluationError(f"loss {self.kind!r}: needs the eval graph and its feeds (host_loss)")

    def cache_key(self) -> str:
        """What the reported loss depends on besides the model and test set."""
        graph = file_sha256(self.eval_model) if self.eval_model else "-"
        pixels = f":{self.ignore_index}:{self.dice_weight}" if self.kind in PIXEL_LOSSES else ""
        pixels += f":{self.heatmap_sigma}:{self.input_hw}" if self.kind == KEYPOINTS_LOSS else ""
        return f"{self.kind}:{graph}:{json.dumps(self.feeds, sort_keys=True)}{pixels}"


def host_loss(recipe: Recipe, prep: Prepared) -> HostLoss:
    """The recipe's loss for host evaluation: its built-in kind, or the prepared eval graph."""
    kind = recipe.loss.kind
    if recipe.task == "segmentation" and kind != "custom":
        spec = segmentation_of(recipe)
        return HostLoss(pixel_kind(kind), ignore_index=spec.ignore_index, dice_weight=spec.dice_weight)
    if recipe.task == "keypoints" and kind != "custom" and recipe.keypoints is not None:
        return keypoints_loss(recipe.keypoints, tuple(recipe.model.input_shape[-2:]))  # type: ignore[arg-type]
    if kind == "distillation":  # the host's test set has true labels: the student's cross-entropy on them
        return HostLoss("cross-entropy")
    if kind not in GRAPH_LOSSES:
        return HostLoss(kind)
    return HostLoss(kind, prep.out_dir / graph_file(prep.manifest, "eval"), dict(prep.manifest["feeds"]))


def task_loss(task: str) -> HostLoss:
    """The usual loss of a task, for callers that pass no :class:`HostLoss`."""
    if task not in TASK_LOSS:
        raise EvaluationError(
            f"task {task!r}: its loss is the eval graph's; pass loss=host_loss(recipe, prepared)"
        )
    return HostLoss(TASK_LOSS[task])


def keypoints_loss(spec: KeypointsSpec, input_hw: tuple[int, int]) -> HostLoss:
    """A keypoints recipe's MSE (its [keypoints] table's targets) on inputs of ``input_hw`` pixels."""
    return HostLoss(KEYPOINTS_LOSS, heatmap_sigma=spec.heatmap_sigma, input_hw=input_hw)


def pixel_kind(kind: str) -> str:
    """A segmentation recipe's loss kind as the host names it: "cross-entropy" -> "pixel-cross-entropy"."""
    return kind.replace("cross-entropy", "pixel-cross-entropy")


def pixel_losses(loss: HostLoss, out: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """A segmentation loss of the whole test set (as one batch) and of each image."""
    sums = loss_sums(out, y, loss.ignore_index)
    kind = loss.kind.replace("pixel-", "")
    return set_loss(kind, sums, loss.dice_weight), image_losses(kind, sums, loss.dice_weight)


def class_logits(logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    logits, labels = class_logits(logits, y)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(labels)), labels].mean())


def per_sample_loss(kind: str, out: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each sample's share of a built-in loss (their mean is the loss): what the promotion gate's
    paired bootstrap resamples."""
    if kind == "cross-entropy":
        logits, labels = class_logits(out, y)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return -log_probs[np.arange(len(labels)), labels]
    p, t = _paired(out, y)
    if kind == "mse":
        return ((p - t) ** 2).mean(axis=1)
    if kind == "l1":
        return np.abs(p - t).mean(axis=1)
    if kind == "bce-with-logits":
        return (np.maximum(p, 0) - p * t + np.log1p(np.exp(-np.abs(p)))).mean(axis=1)
    raise EvaluationError(f"loss kind {kind!r} has no per-sample form on the host (its eval graph averages)")


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
    run, n = _eval_graph_runner(eval_model, model_onnx, arrays)
    total = 0.0
    for start in range(0, n, batch_size):
        end = min(n, start + batch_size)
        total += run(start, end) * (end - start)
    return total / n


def eval_graph_sample_losses(eval_model: Path, model_onnx: Path, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Each sample's loss by the eval graph run on that sample alone (batch 1): the per-sample
    figures the promotion gate's paired bootstrap resamples for a custom or embedded loss."""
    run, n = _eval_graph_runner(eval_model, model_onnx, arrays)
    return np.asarray([run(i, i + 1) for i in range(n)], np.float64)


def _eval_graph_runner(
    eval_model: Path, model_onnx: Path, arrays: dict[str, np.ndarray]
) -> tuple[Callable[[int, int], float], int]:
    """``run(start, end)``: the eval graph's loss on samples [start, end) with ``model_onnx``'s
    weights, and the number of samples."""
    import onnx  # onnx only for a graph loss

    graph = onnx.load_from_string(whole_model(eval_model))  # an autograd eval step with what it leaves out
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
    sess = session(Path(eval_model), graph.SerializeToString())
    loss_name = sess.get_outputs()[0].name

    def run(start: int, end: int) -> float:
        feed = {k: np.ascontiguousarray(arrays[k][start:end], dt) for k, dt in dtypes.items()}
        return float(np.asarray(sess.run([loss_name], feed)[0]).reshape(-1)[0])

    return run, len(next(iter(arrays.values())))


def _np_dtype(value_info: Any) -> np.dtype:
    from onnx.helper import tensor_dtype_to_np_dtype  # onnx only for a graph loss

    return tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type)


def loss_value(
    loss: HostLoss, model_onnx: Path, test_npz: Path, out: np.ndarray, y: np.ndarray, batch_size: int = 64
) -> float:
    """``loss`` of ``model_onnx`` on a test set: from its outputs ``out`` and labels ``y`` for a
    built-in kind, else the eval graph's over the test-set arrays its feeds name."""
    if loss.kind in PIXEL_LOSSES:
        return pixel_losses(loss, out, y)[0]
    if loss.kind == KEYPOINTS_LOSS:
        return keypoint_losses(out, y, loss.input_hw, loss.heatmap_sigma)[0]
    if loss.kind not in GRAPH_LOSSES:
        return BUILTIN_LOSSES[loss.kind](out, y)
    assert loss.eval_model is not None  # HostLoss checks it
    return eval_graph_loss(loss.eval_model, model_onnx, _graph_feeds(loss, test_npz), batch_size)


def sample_losses(
    loss: HostLoss, model_onnx: Path, test_npz: Path, out: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """Each test sample's ``loss``: its share of a built-in kind, or the eval graph's loss of that
    sample alone for a custom or embedded one."""
    if loss.kind in PIXEL_LOSSES:
        return pixel_losses(loss, out, y)[1]
    if loss.kind == KEYPOINTS_LOSS:
        return keypoint_losses(out, y, loss.input_hw, loss.heatmap_sigma)[1]
    if loss.kind not in GRAPH_LOSSES:
        return per_sample_loss(loss.kind, out, y)
    assert loss.eval_model is not None  # HostLoss checks it
    return eval_graph_sample_losses(loss.eval_model, model_onnx, _graph_feeds(loss, test_npz))


def _graph_feeds(loss: HostLoss, test_npz: Path) -> dict[str, np.ndarray]:
    """The eval graph's data inputs from the test-set arrays the loss's feeds name."""
    arrays = npz_arrays(Path(test_npz), sorted(set(loss.feeds.values())))
    return {name: arrays[key] for name, key in loss.feeds.items()}
