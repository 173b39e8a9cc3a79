"""``[keypoints]``: what a pose-estimation recipe (``task = "keypoints"``) adds, and the rules it sets
for the other tables.

A data set's labels are COCO's: float32 ``[N, K, 3]``, each keypoint's ``(x, y, v)`` in the input
image's pixel coordinates (pixel ``i`` spans ``[i, i + 1)``, so a pixel's centre is ``i + 0.5``) and
its visibility ``v`` (0: not labelled, 1: labelled but hidden, 2: visible). The model outputs either
heatmaps ``[N, K, H, W]`` (any size dividing the input's: a keypoint is decoded at its heatmap's
argmax, with a quarter-cell step towards the higher neighbour when ``subpixel``) or coordinates
``[N, K, 2]`` in the input's pixels.

The loss (``[loss] kind = "mse"``) is built into the training graph (:mod:`tasks.prepare.losses.keypoints`):
for heatmaps the mean squared error against Gaussian target heatmaps of ``sigma`` cells drawn from
the labels inside the graph (so the board needs nothing but numpy and ONNX Runtime, and the data
files hold the labels only); for coordinates the squared error of the labelled keypoints. The host
reports COCO's OKS-based AP with pycocotools (``oks_ap``, ``oks_ap50``, ``oks_ap75``) and PCK
(:mod:`tasks.judge.keypoints`) and promotes on ``oks_ap`` by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from tasks.recipe.fields import Bool, Int, Number, Texts, recipe_table
from tasks.recipe.messages import Expect, expected

KEYPOINT_METRICS = ("oks_ap", "oks_ap50", "oks_ap75", "pck")
OKS_METRICS = {"oks_ap": "map", "oks_ap50": "map50", "oks_ap75": "map75"}  # COCO's thresholds of each
KEYPOINT_LOSSES = ("mse",)  # heatmaps: against Gaussian targets; coordinates: of the labelled keypoints
OTHER_LOSSES = ("custom",)  # a custom onnxblock loss over the same outputs and labels
# COCO's per-keypoint OKS sigmas of its 17 person keypoints (pycocotools' default); their mean is
# the default of any other skeleton
COCO_SIGMAS = (.026, .025, .025, .035, .035, .079, .079, .072, .072, .062, .062, .107, .107, .087, .087, .089, .089)  # fmt: skip
DEFAULT_SIGMA = round(sum(COCO_SIGMAS) / len(COCO_SIGMAS), 3)  # 0.067


def _distinct(names: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(names)) != len(names):
        raise expected("distinct keypoint names", got=list(names))
    return names


def _positive(sigmas: tuple[float, ...]) -> tuple[float, ...]:
    if any(not 0 < s <= 10 for s in sigmas):
        raise expected("OKS sigmas in (0, 10]", got=list(sigmas))
    return sigmas


@recipe_table("keypoints")
class KeypointsSpec:
    """``[keypoints]``, task keypoints only: the skeleton, the targets, OKS and PCK, the report."""

    count: Int = Field(ge=1, le=1000, description="K, the keypoints per sample (labels [N, K, 3])")
    names: Annotated[Texts, AfterValidator(_distinct), Expect("a list of distinct keypoint names")] = Field(
        (), description="keypoint names in label order (default: '0' .. 'K - 1')"
    )
    sigmas: Annotated[tuple[float, ...], AfterValidator(_positive), Expect("a list of OKS sigmas")] = Field(
        (),
        description="OKS's per-keypoint sigmas (COCO's kpt_oks_sigmas: how far a guess may stray, as a "
        f"share of the object's size); default COCO's 17 for K = 17, else {DEFAULT_SIGMA} each",
    )
    heatmap_sigma: Number = Field(
        2.0, gt=0, le=100, description="the Gaussian target heatmaps' standard deviation, in heatmap cells"
    )
    subpixel: Bool = Field(
        True, description="decode a heatmap's argmax a quarter cell towards its higher neighbour"
    )
    pck_threshold: Number = Field(
        0.1, gt=0, le=1, description="PCK: a keypoint is right within this share of its object's larger side"
    )
    examples: Int = Field(3, ge=0, le=16, description="test images whose keypoints the report draws")


def keypoint_names(spec: KeypointsSpec) -> tuple[str, ...]:
    """The keypoint names: the table's, else their numbers."""
    return spec.names or tuple(str(k) for k in range(spec.count))


def oks_sigmas(spec: KeypointsSpec) -> tuple[float, ...]:
    """Each keypoint's OKS sigma: the table's, COCO's for 17 keypoints, else DEFAULT_SIGMA each."""
    if spec.sigmas:
        return spec.sigmas
    return COCO_SIGMAS if spec.count == len(COCO_SIGMAS) else (DEFAULT_SIGMA,) * spec.count


def keypoints_rules(recipe: Any) -> Iterator[tuple[str, str, object]]:
    """What task keypoints needs of the other tables: (field, what was expected, what it holds)."""
    task, kind, metric, spec = recipe.task, recipe.loss.kind, recipe.promotion.metric, recipe.keypoints
    if task != "keypoints":
        if metric in KEYPOINT_METRICS:
            yield "promotion.metric", f"a metric the host evaluation reports for task '{task}' ({metric} needs task = 'keypoints')", metric  # fmt: skip
        if spec is not None:
            yield "keypoints", "only with task = 'keypoints'", task
        return
    if spec is None:
        yield "keypoints.count", "the keypoints per sample (a [keypoints] table, required for task 'keypoints')", None  # fmt: skip
        return
    if kind not in (*KEYPOINT_LOSSES, *OTHER_LOSSES):
        yield "loss.kind", "mse (heatmaps against Gaussian targets) or custom:module:factory for task 'keypoints'", kind  # fmt: skip
    if spec.names and len(spec.names) != spec.count:
        yield "keypoints.names", f"{spec.count} names (keypoints.count)", list(spec.names)
    if spec.sigmas and len(spec.sigmas) != spec.count:
        yield "keypoints.sigmas", f"{spec.count} OKS sigmas (keypoints.count)", list(spec.sigmas)
    if metric not in (*KEYPOINT_METRICS, "loss"):
        yield "promotion.metric", f"a metric the host evaluation reports for task 'keypoints' ({', '.join(KEYPOINT_METRICS)} or 'loss')", metric  # fmt: skip
    if recipe.data.board_dataset is not None and recipe.data.board_format != "npz-shards":
        yield "data.board_format", "'npz-shards' for task 'keypoints' (an image folder's labels are classes, not keypoints)", recipe.data.board_format  # fmt: skip
