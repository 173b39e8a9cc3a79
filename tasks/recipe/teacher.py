"""``[teacher]``: a model that labels the board's unlabeled shards on the board, before the student
trains on them (:mod:`device_agent.teacher.labels` does the labelling; this table says how).

    [teacher]
    model = "data/digits-teacher/teacher.onnx"   # any ONNX the board's ONNX Runtime loads
    labels = "hard"          # hard: top class above threshold | soft: the distribution at temperature
    threshold = 0.9          # samples whose top probability is lower are not trained on
    balance_cap = 0          # hard labels: at most this many teacher-labeled samples per class (0: no cap)
    temperature = 2.0        # soft labels (with loss.kind = "distillation")
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field

from tasks.recipe.fields import FilePath, Int, Number, Text, recipe_table

DISTILLATION = "distillation"


@recipe_table("teacher")
class TeacherSpec:
    """``[teacher]``: an ONNX model run on the board over the unlabeled shards of ``data.board_dataset``."""

    model: FilePath = Field(description="the teacher's ONNX file (uploaded once as a content-addressed blob)")
    labels: Literal["hard", "soft", "boxes"] = Field(
        "hard",
        description="hard: the top class, as the recipe's loss trains | soft: the teacher's distribution "
        "at temperature, for loss.kind = 'distillation' | boxes: a detector teacher's boxes, matched to "
        "the student detector's priors",
    )
    scores: Literal["logits", "probabilities"] = Field(
        "logits", description="what the teacher's output holds: logits | probabilities (rows summing to 1)"
    )
    threshold: Number = Field(
        0.0, ge=0, le=1, description="keep a sample only when the teacher's top probability is at least this"
    )
    balance_cap: Int = Field(
        0, ge=0, le=10**9, description="hard labels: at most this many teacher-labeled samples per class, "
        "the most confident first (0: no cap)"
    )  # fmt: skip
    temperature: Number = Field(
        2.0, gt=0, le=100, description="soft labels: softmax(logits / temperature); the loss uses the same T"
    )
    input: Text = Field("x", description="the shard array fed to the teacher's first input")
    output: str = Field(
        "", description="the teacher output read ('' = its first): [N, classes] | boxes: scores [N, K, C + 1]"
    )
    boxes_output: str = Field("", description="boxes: the teacher's corner boxes output [N, K, 4] in [0, 1]")
    iou_threshold: Number = Field(0.45, gt=0, le=1, description="boxes: the teacher's per-class NMS")
    match_iou: Number = Field(
        0.5, gt=0, le=1, description="boxes: a student prior takes a box it overlaps this much"
    )
    max_boxes: Int = Field(50, ge=1, le=10000, description="boxes: detections kept per image, best first")
    batch_size: Int = Field(64, ge=1, le=65536, description="rows per teacher inference on the board")
    ram_budget_mb: Number = Field(
        2048.0, gt=0, le=10**6,
        description="the job's RAM on the board: training's estimate plus the teacher's must fit (checked offline)",
    )  # fmt: skip


def teacher_rules(recipe: Any) -> Iterator[tuple[str, str, object]]:
    """(field, expected, got) for each rule a recipe with (or without) a teacher breaks."""
    teacher, kind = recipe.teacher, recipe.loss.kind
    if teacher is None:
        if kind == DISTILLATION:
            yield (
                "loss.kind",
                "a [teacher] table with labels = 'soft' (distillation learns its distribution)",
                kind,
            )
        return
    boxes = teacher.labels == "boxes"
    if boxes and recipe.detection is None:
        yield (
            "teacher.labels",
            "'hard' or 'soft' for a classifier ('boxes' needs a [detection] student)",
            "boxes",
        )
    if boxes and not teacher.boxes_output:
        yield "teacher.boxes_output", "the teacher's boxes output (labels = 'boxes')", teacher.boxes_output
    if boxes and len(recipe.model.input_names) < 3:
        yield (
            "model.input_names",
            "images, per-prior labels and offsets (a detector with its loss inside)",
            None,
        )
    if not boxes and recipe.task != "classification":
        yield (
            "teacher.labels",
            f"'boxes' for task '{recipe.task}' (hard and soft labels are classes)",
            teacher.labels,
        )
    if recipe.data.board_dataset is None or recipe.data.board_format != "npz-shards":
        yield (
            "teacher",
            "data.board_dataset with board_format = 'npz-shards': the teacher labels the board's shards",
            recipe.data.board_dataset,
        )
    if teacher.labels == "soft" and kind != DISTILLATION:
        yield "loss.kind", "'distillation' with teacher.labels = 'soft'", kind
    if teacher.labels == "hard" and kind == DISTILLATION:
        yield (
            "loss.kind",
            "the loss of hard labels ('cross-entropy'); 'distillation' needs labels = 'soft'",
            kind,
        )
    if teacher.balance_cap and teacher.labels != "hard":
        yield "teacher.balance_cap", "0 with soft labels (the cap balances hard labels)", teacher.balance_cap
    if teacher.model.suffix != ".onnx":
        yield "teacher.model", "an .onnx file", str(teacher.model)


def label_keys(recipe: Any) -> tuple[str, ...]:
    """The shard arrays that hold the labels: the feeds of the model's inputs after the first
    (default "y", then "offsets")."""
    names = recipe.model.input_names
    feeds = dict(recipe.data.feeds) or dict(zip(names, ("x", "y", "offsets"), strict=False))
    keys = tuple(feeds[n] for n in names[1:] if n in feeds)
    return keys or ("y",)


def label_key(recipe: Any) -> str:
    """The shard array whose absence marks a shard unlabeled (the first label array)."""
    return label_keys(recipe)[0]
