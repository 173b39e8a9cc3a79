"""``[segmentation]``: what a semantic segmentation recipe (``task = "segmentation"``) adds, and the
rules it sets for the other tables.

The model outputs class scores ``[N, C, H, W]`` (``C = model.num_classes``); a data set's labels are
``[N, H, W]`` int64, each pixel a class in ``[0, C)`` or ``ignore_index``. The default ignore index is
**255**, not PyTorch's -100: masks come as 8-bit PNG files (Pascal VOC, Cityscapes and ADE20K mark
void and boundary pixels 255), and 255 survives a uint8 mask where -100 cannot be stored; a recipe
whose data uses -100 says ``ignore_index = -100``. The table may be left out: its defaults apply.

The losses (``[loss] kind``) are ``cross-entropy`` (per pixel), ``dice`` or ``cross-entropy+dice``
(:mod:`tasks.prepare.losses.segmentation`); the host reports mIoU, per-class IoU and pixel accuracy
(:mod:`tasks.judge.segmentation`) and promotes on ``miou`` by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from tasks.recipe.fields import Int, Number, Texts, recipe_table
from tasks.recipe.messages import Expect, expected
from tasks.recipe.training import PIXEL_LOSSES

IGNORE_INDEX = 255
SEGMENTATION_LOSSES = ("cross-entropy", *PIXEL_LOSSES)
DICE_SMOOTH = 1.0  # the soft Dice loss's Laplace smoothing, on the board and on the host
SEGMENTATION_METRICS = ("miou", "pixel_accuracy")
OTHER_LOSSES = ("custom",)  # a custom onnxblock loss over the same outputs and labels


def _distinct(classes: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(classes)) != len(classes):
        raise expected("distinct class names", got=list(classes))
    return classes


@recipe_table("segmentation")
class SegmentationSpec:
    """``[segmentation]``, task segmentation only: labels, ignored pixels, background, the report."""

    classes: Annotated[Texts, AfterValidator(_distinct), Expect("a list of distinct class names")] = Field(
        (), description="class names in label order (default: '0' .. 'num_classes - 1')"
    )
    ignore_index: Int = Field(
        IGNORE_INDEX,
        ge=-(2**31),
        le=2**31 - 1,
        description="the label of pixels no loss or metric counts (255: void/boundary pixels of 8-bit PNG "
        "masks; -100 for PyTorch's default); must not be a class",
    )
    background: Int = Field(
        0,
        ge=-1,
        le=100000,
        description="the background class: a candidate is promoted only when its mIoU over the other "
        "classes rises significantly too (a model that learns only the background never is); -1: none",
    )
    dice_weight: Number = Field(1.0, gt=0, le=1000, description="loss cross-entropy+dice: Dice's weight")
    examples: Int = Field(3, ge=0, le=16, description="test images whose masks the report draws")


def segmentation_of(recipe: Any) -> SegmentationSpec:
    """The recipe's ``[segmentation]`` table, its defaults when it has none."""
    return recipe.segmentation or SegmentationSpec()


def class_names(recipe: Any) -> tuple[str, ...]:
    """The class names: the table's, else the label numbers."""
    spec = segmentation_of(recipe)
    return spec.classes or tuple(str(c) for c in range(recipe.model.num_classes or 0))


def segmentation_rules(recipe: Any) -> Iterator[tuple[str, str, object]]:
    """What task segmentation needs of the other tables: (field, what was expected, what it holds)."""
    task, kind, metric = recipe.task, recipe.loss.kind, recipe.promotion.metric
    if task != "segmentation":
        if metric in SEGMENTATION_METRICS:
            reported = f"a metric the host evaluation reports for task '{task}' ({metric} needs task = 'segmentation')"
            yield "promotion.metric", reported, metric
        if recipe.segmentation is not None:
            yield "segmentation", "only with task = 'segmentation'", task
        if kind in PIXEL_LOSSES:
            yield "loss.kind", f"'{kind}' only with task = 'segmentation'", kind
        return
    classes, spec = recipe.model.num_classes, segmentation_of(recipe)
    if classes is None:
        yield (
            "model.num_classes",
            "the classes of the segmentation output (required for task 'segmentation')",
            None,
        )
        return
    if kind not in (*SEGMENTATION_LOSSES, *OTHER_LOSSES):
        yield (
            "loss.kind",
            f"{', '.join(SEGMENTATION_LOSSES)} or custom:module:factory for task 'segmentation'",
            kind,
        )
    if spec.classes and len(spec.classes) != classes:
        yield "segmentation.classes", f"{classes} names (model.num_classes)", list(spec.classes)
    if 0 <= spec.ignore_index < classes:
        yield (
            "segmentation.ignore_index",
            f"a label outside the classes [0, {classes - 1}] (255 or -100)",
            spec.ignore_index,
        )
    if spec.background >= classes:
        yield "segmentation.background", f"a class in [0, {classes - 1}], or -1 for none", spec.background
    if recipe.data.board_dataset is not None and recipe.data.board_format != "npz-shards":
        yield (
            "data.board_format",
            "'npz-shards' for task 'segmentation' (an image folder's labels are classes, not masks)",
            recipe.data.board_format,
        )
