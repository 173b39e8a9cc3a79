"""The segmentation and keypoints losses of the autograd runtime's step, in PyTorch: the ORT path's
loss blocks (:mod:`tasks.prepare.losses.segmentation`, :mod:`tasks.prepare.losses.keypoints`) formula
for formula, so both runtimes train a recipe on the same loss.

* segmentation, scores ``[N, C, spatial...]``, labels int64 ``[N, spatial...]``: ``cross-entropy``
  (the mean over the pixels that are not ``ignore_index``, as ONNX's ``SoftmaxCrossEntropyLoss``),
  ``dice`` (softmax probabilities and one-hot labels zeroed on ignored pixels, summed over the batch
  and the spatial axes per class, Laplace smoothing :data:`DICE_SMOOTH`) or their sum with Dice
  weighted by ``segmentation.dice_weight``;
* keypoints, labels float32 ``[N, K, 3]`` (x, y, visibility): heatmaps ``[N, K, H, W]`` against the
  Gaussian targets of the labels, or coordinates ``[N, K, 2]``, the squared error of the labelled
  keypoints (``v > 0``), each a mean over the output's elements as the ORT block reduces it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tasks.prepare.losses.keypoints import heatmap_grid, output_kind
from tasks.prepare.losses.segmentation import check_scores
from tasks.recipe.schema import Recipe
from tasks.recipe.segmentation import DICE_SMOOTH, SEGMENTATION_LOSSES, segmentation_of

TaskLoss = Callable[[Any, Any], Any]


def segmentation(kind: str, scores: Any, labels: Any, ignore_index: int, dice_weight: float = 1.0) -> Any:
    """The segmentation loss ``kind`` (one of SEGMENTATION_LOSSES) of ``scores`` against ``labels``."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    loss = None
    if kind != "dice":
        loss = torch.nn.functional.cross_entropy(scores, labels, ignore_index=ignore_index)
    if kind != "cross-entropy":
        dice = soft_dice(scores, labels, ignore_index)
        loss = dice if loss is None else loss + dice * dice_weight
    return loss


def soft_dice(scores: Any, labels: Any, ignore_index: int) -> Any:
    """``1 - mean_c (2 sum(p_c t_c) + s) / (sum(p_c) + sum(t_c) + s)`` over the kept pixels."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    classes, rank = scores.shape[1], scores.dim()
    kept = (labels != ignore_index).unsqueeze(1).to(scores.dtype)
    ids = torch.arange(classes, dtype=labels.dtype).reshape([1, classes] + [1] * (rank - 2))
    onehot = (labels.unsqueeze(1) == ids).to(scores.dtype)
    p = torch.softmax(scores, dim=1) * kept
    axes = [0, *range(2, rank)]
    inter = (p * onehot).sum(dim=axes)
    total = p.sum(dim=axes) + onehot.sum(dim=axes)
    return 1.0 - ((inter * 2.0 + DICE_SMOOTH) / (total + DICE_SMOOTH)).mean()


def keypoints(out: Any, labels: Any, input_hw: tuple[int, int], heatmap_sigma: float) -> Any:
    """The keypoints MSE of heatmaps ``[N, K, H, W]`` or coordinates ``[N, K, 2]`` against ``labels``."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    weight = (labels[..., 2:3] > 0).to(out.dtype)  # [N, K, 1]
    if out.dim() == 3:
        err = ((out - labels[..., :2]) ** 2).sum(dim=2, keepdim=True)
        return (err * weight).mean()
    xs, ys, stride = heatmap_grid((int(out.shape[2]), int(out.shape[3])), input_hw)
    grid_x = torch.from_numpy(xs.astype(np.float32)).reshape(1, 1, 1, -1)
    grid_y = torch.from_numpy(ys.astype(np.float32)).reshape(1, 1, -1, 1)
    dx = grid_x - labels[..., 0:1].unsqueeze(3)
    dy = grid_y - labels[..., 1:2].unsqueeze(3)
    scale = -1.0 / (2.0 * (heatmap_sigma * stride) ** 2)
    target = torch.exp((dx * dx + dy * dy) * scale)
    return ((out - target) ** 2 * weight.unsqueeze(3)).mean()


def task_loss(recipe: Recipe, out: Any, name: str) -> tuple[TaskLoss, str, Any]:
    """For a segmentation or keypoints recipe whose one output is ``out`` (an example tensor):
    ``fn(output, labels) -> loss``, the manifest's name of the loss (the ORT path's) and an example
    label batch's fallback (zeros of the labels' shape and dtype). RecipeError for a wrong shape."""
    dims, batch = ["batch", *out.shape[1:]], int(out.shape[0])  # messages name the batch as the ORT path's
    if recipe.task == "segmentation":
        spec, kind = segmentation_of(recipe), recipe.loss.kind
        check_scores(dims, name, recipe.model.num_classes or 0, kind)
        assert kind in SEGMENTATION_LOSSES  # the recipe's rules allow no other

        def seg(o: Any, lab: Any) -> Any:
            return segmentation(kind, o, lab, spec.ignore_index, spec.dice_weight)

        fallback = np.zeros([batch, *dims[2:]], np.int64)
        return seg, f"{kind} (per pixel, ignore_index {spec.ignore_index})", fallback
    kp = recipe.keypoints
    assert kp is not None  # task keypoints has a [keypoints] table (its rules)
    heat = output_kind(dims, name, kp.count) == "heatmaps"
    hw = (int(recipe.model.input_shape[-2]), int(recipe.model.input_shape[-1]))

    def kps(o: Any, lab: Any) -> Any:
        return keypoints(o, lab, hw, kp.heatmap_sigma)

    what = f"heatmaps (Gaussian targets, sigma {kp.heatmap_sigma:g})" if heat else "coordinates"
    return kps, f"{recipe.loss.kind} of {what}", np.zeros([batch, kp.count, 3], np.float32)
