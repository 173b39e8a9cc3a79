"""The loss of a keypoints recipe (``task = "keypoints"``, ``[loss] kind = "mse"``), as an onnxblock
loss ORT differentiates; the targets are made from the labels inside the graph.

The labels are a graph input ``labels``: float32 ``[N, K, 3]``, each keypoint's ``(x, y, v)`` in the
input's pixel coordinates (pixel ``i`` spans ``[i, i + 1)``) and COCO's visibility ``v``; a keypoint
with ``v = 0`` (not labelled) counts for nothing.

* heatmaps ``[N, K, H, W]``: cell ``(i, j)`` stands for the input point ``((j + 0.5) * sx, (i + 0.5) * sy)``
  (``sx``, ``sy``: the input's size over the heatmap's). The target of keypoint ``k`` is the Gaussian
  ``exp(-d^2 / (2 * (heatmap_sigma * s)^2))`` of the distance ``d`` from that point to the label (the
  usual "JointsMSELoss" targets, amplitude 1), and the loss the mean over ``N, K, H, W`` of
  ``w * (heatmap - target)^2``, ``w = 1`` for a labelled keypoint, else 0.
* coordinates ``[N, K, 2]``: the mean over ``N, K`` of ``w * ((x' - x)^2 + (y' - y)^2)``.

Making the targets in the graph keeps the data files COCO's labels only, and the board needs no code
of its own: its numpy + ONNX Runtime run it. The host computes the same numbers in numpy
(:func:`tasks.judge.keypoints.keypoint_losses`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from tasks.errors import RecipeError
from tasks.prepare.losses.block_ops import block_ops


def output_kind(dims: list[Any], name: str, count: int) -> str:
    """ "heatmaps" for ``[batch, K, H, W]``, "coordinates" for ``[batch, K, 2]``; else RecipeError."""
    if len(dims) == 4 and dims[1] == count and all(isinstance(d, int) for d in dims[2:]):
        return "heatmaps"
    if len(dims) == 3 and dims[1] == count and dims[2] == 2:
        return "coordinates"
    raise RecipeError(
        "loss.kind",
        f"a keypoints output of shape [batch, K={count}, H, W] (heatmaps) or [batch, K={count}, 2] "
        "(coordinates) for 'mse'",
        f"output '{name}' has shape [{', '.join(str(d or '?') for d in dims)}]",
    )


def heatmap_grid(
    heatmap_hw: tuple[int, int], input_hw: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, float]:
    """The input-pixel coordinates of the heatmap cells' centres (``xs`` ``[W]``, ``ys`` ``[H]``) and
    the mean stride (input pixels per cell), the board's and the host's both."""
    (h, w), (ih, iw) = heatmap_hw, input_hw
    sx, sy = iw / w, ih / h
    return (np.arange(w) + 0.5) * sx, (np.arange(h) + 0.5) * sy, (sx + sy) / 2


def keypoints_loss(count: int, input_hw: tuple[int, int], heatmap_sigma: float, dims: list[Any],
                   labels: str = "labels") -> Any:  # fmt: skip
    """An onnxblock Block computing the keypoints MSE of its output (``dims``: :func:`output_kind`)."""
    from onnxruntime.training import onnxblock  # imports torch: only when graphs are generated
    from onnxruntime.training.onnxblock import _graph_utils  # onnxblock's helpers, as its losses use

    class KeypointsLoss(onnxblock.Block):
        def build(self, out: str) -> str:
            graph, kind = self.base.graph, output_kind(dims, out, count)
            const, node = block_ops(graph, "kp")
            if not _graph_utils.node_arg_exists(self.base, labels):
                shape = [dims[0] or "batch", count, 3]
                graph.input.append(onnx.helper.make_tensor_value_info(labels, onnx.TensorProto.FLOAT, shape))

            def column(c: int, rank: int) -> str:  # labels[:, :, c] as [N, K] + [1] * (rank - 2)
                part = node(
                    "Slice", [labels, const([c], np.int64), const([c + 1], np.int64), const([2], np.int64)]
                )
                return part if rank == 3 else node("Unsqueeze", [part, const([3], np.int64)])

            rank = 4 if kind == "heatmaps" else 3
            x, y, v = column(0, rank), column(1, rank), column(2, rank)
            weight = node("Cast", [node("Greater", [v, const(0.0)])], to=onnx.TensorProto.FLOAT)
            if kind == "coordinates":  # [N, K, 1] each: squared distance of (x', y') to (x, y)
                diff = node("Sub", [out, node("Concat", [x, y], axis=2)])
                err = node("ReduceSum", [node("Mul", [diff, diff]), const([2], np.int64)], keepdims=1)
                return node("ReduceMean", [node("Mul", [err, weight])], keepdims=0)
            xs, ys, stride = heatmap_grid((int(dims[2]), int(dims[3])), input_hw)
            dx = node("Sub", [const(xs.reshape(1, 1, 1, -1)), x])
            dy = node("Sub", [const(ys.reshape(1, 1, -1, 1)), y])
            d2 = node("Add", [node("Mul", [dx, dx]), node("Mul", [dy, dy])])
            scale = -1.0 / (2.0 * (heatmap_sigma * stride) ** 2)
            target = node("Exp", [node("Mul", [d2, const(scale)])])
            diff = node("Sub", [out, target])
            return node("ReduceMean", [node("Mul", [node("Mul", [diff, diff]), weight])], keepdims=0)

    return KeypointsLoss()


def gaussian_targets(labels: np.ndarray, heatmap_hw: tuple[int, int], input_hw: tuple[int, int],
                     heatmap_sigma: float) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The graph's targets in numpy: Gaussian heatmaps ``[N, K, H, W]`` and weights ``[N, K, 1, 1]``."""
    xs, ys, stride = heatmap_grid(heatmap_hw, input_hw)
    lx, ly, v = (labels[..., c][..., None, None].astype(np.float64) for c in range(3))
    d2 = (xs[None, None, None, :] - lx) ** 2 + (ys[None, None, :, None] - ly) ** 2
    return np.exp(-d2 / (2.0 * (heatmap_sigma * stride) ** 2)), (v > 0).astype(np.float64)
