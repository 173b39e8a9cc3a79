"""The losses of a segmentation recipe (``task = "segmentation"``), as onnxblock losses ORT
differentiates: per-pixel cross-entropy, soft Dice, or both (``[loss] kind``).

The model's output is ``[N, C, H, W]`` (classes on axis 1, any number of spatial axes); the labels
are a graph input ``labels``: int64 ``[N, H, W]``, a class in ``[0, C)`` or ``ignore_index``.

* ``cross-entropy``: ONNX's ``SoftmaxCrossEntropyLoss`` over ``[N, C, d1, ...]`` with the recipe's
  ``ignore_index`` (mean over the pixels that are not ignored). onnxblock's own ``CrossEntropyLoss``
  cannot be used: it takes classes on the last axis and makes the labels ``[N, C, H]``.
* ``dice``: ``1 - mean_c (2 * sum(p_c * t_c) + 1) / (sum(p_c) + sum(t_c) + 1)``, ``p`` the softmax
  probabilities, ``t`` the one-hot labels, both zero on ignored pixels, sums over the batch and the
  spatial axes (Laplace smoothing 1: a class absent from the batch and not predicted scores 1).
* ``cross-entropy+dice``: their sum, Dice weighted by ``segmentation.dice_weight``.

The host computes the same numbers in numpy (:mod:`tasks.judge.segmentation_losses`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from tasks.errors import RecipeError
from tasks.prepare.graph import observed_shapes
from tasks.prepare.losses.block_ops import block_ops
from tasks.recipe.segmentation import DICE_SMOOTH, SEGMENTATION_LOSSES


def output_dims(model: onnx.ModelProto, name: str) -> list[Any]:
    """An output's dims: an int, a symbolic name, or None when unknown."""
    out = next(o for o in model.graph.output if o.name == name)
    return [d.dim_value or d.dim_param or None for d in out.type.tensor_type.shape.dim]


def scores_dims(model: onnx.ModelProto, name: str) -> list[Any]:
    """The scores output's dims, those after the batch measured by a run when the exporter left them
    symbolic (``F.interpolate(x, size=input.shape[-2:])``: torchvision's LR-ASPP)."""
    dims = output_dims(model, name)
    if all(isinstance(d, int) for d in dims[1:]):
        return dims
    measured = observed_shapes(model).get(name) or []
    if len(measured) != len(dims):
        return dims
    return [dims[0], *(d if isinstance(d, int) else m for d, m in zip(dims[1:], measured[1:], strict=True))]


def check_scores(dims: list[Any], name: str, num_classes: int, kind: str) -> None:
    """RecipeError unless the scores are ``[batch, num_classes, spatial...]``."""
    if len(dims) < 3 or dims[1] != num_classes:
        raise RecipeError(
            "loss.kind",
            f"a segmentation output of shape [batch, num_classes={num_classes}, H, W] for '{kind}'",
            f"output '{name}' has shape [{', '.join(str(d or '?') for d in dims)}]",
        )


def segmentation_loss(kind: str, num_classes: int, ignore_index: int, dice_weight: float = 1.0,
                      labels: str = "labels", dims: list[Any] | None = None) -> Any:  # fmt: skip
    """An onnxblock Block computing ``kind`` (one of SEGMENTATION_LOSSES) of its scores input (whose
    ``dims`` are the graph's unless given: :func:`scores_dims`)."""
    from onnxruntime.training import onnxblock  # imports torch: only when graphs are generated
    from onnxruntime.training.onnxblock import _graph_utils  # onnxblock's helpers, as its losses use

    if kind not in SEGMENTATION_LOSSES:
        raise RecipeError("loss.kind", " | ".join(SEGMENTATION_LOSSES), kind)

    class SegmentationLoss(onnxblock.Block):
        def build(self, scores: str) -> str:
            graph = self.base.graph
            const, node = block_ops(graph, "seg")
            shape = dims or output_dims(self.base, scores)
            check_scores(shape, scores, num_classes, kind)
            if not _graph_utils.node_arg_exists(self.base, labels):
                graph.input.append(_labels_input(labels, shape))

            ce = dice = None
            if kind != "dice":  # log_prob: the output ORT's gradient of the loss reads
                ce = node("SoftmaxCrossEntropyLoss", [scores, labels], outputs=2, reduction="mean",
                          ignore_index=ignore_index)  # fmt: skip
            if kind != "cross-entropy":
                dice = _dice(node, const, scores, labels, num_classes, ignore_index, len(shape))
            if ce is None or dice is None:
                return ce or dice  # type: ignore[return-value]
            return node("Add", [ce, node("Mul", [dice, const(dice_weight)])])

    return SegmentationLoss()


def _labels_input(labels: str, dims: list[Any]) -> onnx.ValueInfoProto:
    """int64 ``[N, spatial...]``: the scores' dims without the class axis, an unknown spatial dim
    named on its own (an exporter may name it as the batch, which would tie the two)."""
    shape: list[Any] = [dims[0] or "batch"]
    shape += [d if isinstance(d, int) else f"{labels}_d{k}" for k, d in enumerate(dims[2:], start=1)]
    return onnx.helper.make_tensor_value_info(labels, onnx.TensorProto.INT64, shape)


def _dice(node: Any, const: Any, scores: str, labels: str, classes: int, ignore: int, rank: int) -> str:
    """The soft Dice loss nodes; returns the scalar loss's name."""
    probs = node("Softmax", [scores], axis=1)
    axis1 = const([1], np.int64)
    kept = node("Unsqueeze", [node("Cast", [node("Not", [node("Equal", [labels, const(ignore, np.int64)])])],
                                   to=onnx.TensorProto.FLOAT), axis1])  # fmt: skip
    ids = const(np.arange(classes, dtype=np.int64).reshape([1, classes] + [1] * (rank - 2)), np.int64)
    onehot = node(
        "Cast", [node("Equal", [node("Unsqueeze", [labels, axis1]), ids])], to=onnx.TensorProto.FLOAT
    )
    p = node("Mul", [probs, kept])
    axes = const([0, *range(2, rank)], np.int64)
    inter = node("ReduceSum", [node("Mul", [p, onehot]), axes], keepdims=0)
    total = node(
        "Add", [node("ReduceSum", [p, axes], keepdims=0), node("ReduceSum", [onehot, axes], keepdims=0)]
    )
    smooth = const(DICE_SMOOTH)
    score = node(
        "Div", [node("Add", [node("Mul", [inter, const(2.0)]), smooth]), node("Add", [total, smooth])]
    )
    return node("Sub", [const(1.0), node("ReduceMean", [score], keepdims=0)])
