"""The recipe schema: every table and key of a recipe TOML file, with its type, bounds, default and
help written once, as frozen pydantic dataclasses that every stage shares.

A recipe file is one :class:`Recipe`::

    name = "digits"
    task = "classification"
    [model]        # callable = "models:digits_cnn", input_shape = [1, 8, 8], num_classes = 10
    [trainable]    # strategy = "last-conv+classifier"
    [loss]         # kind = "cross-entropy"
    [data]         # train = "data/train.npz", test = "data/test.npz"
    # optional: [optimizer] [schedule] [training] [promotion] [fleet] [head] [quantize] [detection] [teacher]

The fields below are the reference (each ``description`` is its help); ``odl recipe schema`` writes
them as a JSON Schema (``recipes/recipe.schema.json``) for editors. Unknown keys are errors, and so
is every wrong value: the loader (:mod:`tasks.recipe.load`) turns pydantic's errors into one-line
:class:`~tasks.errors.RecipeError` messages naming the field (:mod:`tasks.recipe.messages`). Rules
between fields of one table are the table's ``model_validator``; rules across tables are the
recipe's (:meth:`Recipe._consistent`). Paths are absolute after loading (relative ones resolve
against the recipe file's folder). The flows' parameters reuse the shared types (``Epochs``,
``BatchSize``, ``LearningRate``, ...), so their bounds are these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from device_agent.protocol import TASKS
from tasks.errors import RecipeError
from tasks.recipe.data_table import DataSpec
from tasks.recipe.extras import DetectionSpec, FleetSpec, HeadSpec, PromotionSpec, QuantizeSpec
from tasks.recipe.fields import (
    NAME_PATTERN,
    FilePath,
    Int,
    Ref,
    Text,
    Texts,
    present,
    recipe_table,
)
from tasks.recipe.keypoints import KEYPOINT_METRICS, KeypointsSpec, keypoints_rules
from tasks.recipe.messages import Expect, expected
from tasks.recipe.segmentation import SEGMENTATION_METRICS, SegmentationSpec, segmentation_rules
from tasks.recipe.teacher import TeacherSpec, teacher_rules
from tasks.recipe.training import (
    LossSpec,
    OptimizerSpec,
    ScheduleSpec,
    TrainableSpec,
    TrainingSpec,
    runtime_rules,
)

InputDtype = Literal["float32", "float64", "int64", "int32", "int8", "uint8", "bool"]
# the board's task names (device_agent.protocol), and "detection": a detector whose loss is in its
# graph, with a [detection] table; the loader makes it "embedded", the task the board runs
Task = Literal[(*TASKS, "detection")]  # type: ignore[valid-type]

ACCURACY_TASKS = ("classification", "binary")
DETECTION_METRICS = ("map50", "map", "map75")
TESTED_METRICS = ("accuracy", "loss", "mse", "mae", *DETECTION_METRICS, *SEGMENTATION_METRICS,
                  *KEYPOINT_METRICS)  # fmt: skip  # those with a paired test in the gate
OPTIONAL_TABLES = ("head", "quantize", "detection", "teacher", "segmentation")  # an empty table: none
OTHER_METRICS = {"segmentation": "'miou', 'pixel_accuracy' or 'loss'",
                 "keypoints": "'oks_ap', 'pck' or 'loss'"}  # fmt: skip  # promotion.metric's message
TASK_METRIC = {"segmentation": "miou", "keypoints": "oks_ap"}  # a task's default promotion metric


@recipe_table("model")
class ModelSpec:
    """``[model]``: the model to train, exactly one of ``torchvision``, ``callable`` or ``onnx``."""

    input_shape: Annotated[
        tuple[Annotated[Int, Field(gt=0)], ...],
        Expect("a non-empty list of positive integers (one sample, no batch axis)"),
    ] = Field(min_length=1, description="one sample's shape, without the batch axis")
    torchvision: Text | None = Field(None, description="a torchvision classification model by name")
    callable: Ref | None = Field(
        None, description="module:callable returning an nn.Module (the recipe's folder is on sys.path)"
    )
    onnx: FilePath | None = Field(
        None,
        description="an existing ONNX file (training- or eval-mode export, BatchNorm folded or not, "
        "opset 13-21, external data allowed)",
    )
    num_classes: Annotated[Int, Field(ge=1)] | None = Field(
        None,
        description="classes of the model's output; torchvision: its new classifier head (required); a "
        "module:callable builder receives it as num_classes when it names that parameter or takes **kwargs",
    )
    weights: FilePath | None = Field(None, description="a local state_dict file to load")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the callable / torchvision builder"
    )
    input_names: Texts = Field(("input",), description="the model's input names")
    input_dtype: InputDtype = Field(
        "float32",
        description="dtype of the model's first input, the data's x: float32 (images, signals) | int64 or "
        "int32 (token ids of an embedding) | float64, int8, uint8, bool",
    )
    output_names: Texts = Field(
        ("output",), description="the model's outputs (task embedded: the loss first)"
    )
    cut_at: Texts = Field(
        (),
        description="onnx only: tensors after which everything is dropped",
        json_schema_extra={"minItems": 1},  # () is the default: a file may not give []
    )

    @property
    def kind(self) -> str:
        """torchvision | callable | onnx."""
        return "onnx" if self.onnx is not None else "callable" if self.callable is not None else "torchvision"

    @property
    def ref(self) -> str:
        """The torchvision model name, the ``module:callable``, or the ONNX path (absolute)."""
        return str(self.onnx) if self.onnx is not None else self.callable or self.torchvision or ""

    @model_validator(mode="before")
    @classmethod
    def _no_empty_cut(cls, data: Any) -> Any:
        sources = present(data, ("torchvision", "callable", "onnx"))
        if isinstance(data, dict) and len(sources) != 1:  # what the model is comes before its fields
            raise expected(
                "exactly one of model.torchvision, model.callable, model.onnx", "torchvision", sources or None
            )
        if present(data, ("cut_at",)) and data["cut_at"] == []:
            raise expected("a non-empty list of tensor names", "cut_at", [])
        return data

    @model_validator(mode="after")
    def _one_model(self) -> ModelSpec:
        kinds = [k for k in ("torchvision", "callable", "onnx") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise expected(
                "exactly one of model.torchvision, model.callable, model.onnx", "torchvision", kinds or None
            )
        if self.torchvision is not None and self.num_classes is None:
            raise expected("an integer >= 1 (required for torchvision models)", "num_classes")
        if self.cut_at and self.onnx is None:
            raise expected(
                "only with model.onnx (a PyTorch model is cut in its own code)", "cut_at", list(self.cut_at)
            )
        return self


@recipe_table("")
class Recipe:
    """A recipe file: what to train, how, on which data, and when to promote the result."""

    name: Annotated[str, Expect("1-64 chars of [a-z0-9_-] starting with a letter or digit")] = Field(
        pattern=NAME_PATTERN, description="names runs and registry folders"
    )
    task: Task = Field(
        "classification",
        description="classification | binary | regression | segmentation (class scores [N, C, H, W], "
        "labels [N, H, W]) | keypoints (heatmaps [N, K, H, W] or coordinates [N, K, 2], labels [N, K, 3]) | "
        "embedded (the loss is in the model) | detection (a detector whose loss is in the model, scored by "
        "its [detection] table: embedded by its own name, the loss kind 'embedded' by default)",
    )
    model: ModelSpec = Field()  # Field(): required, though after a field with a default
    trainable: TrainableSpec = Field()
    loss: LossSpec = Field()
    data: DataSpec = Field()
    optimizer: OptimizerSpec = dataclasses.field(default_factory=OptimizerSpec)
    schedule: ScheduleSpec = dataclasses.field(default_factory=ScheduleSpec)
    training: TrainingSpec = dataclasses.field(default_factory=TrainingSpec)
    promotion: PromotionSpec = dataclasses.field(default_factory=PromotionSpec)
    detection: DetectionSpec | None = None
    segmentation: SegmentationSpec | None = None
    keypoints: KeypointsSpec | None = None
    head: HeadSpec | None = None
    quantize: QuantizeSpec | None = None
    teacher: TeacherSpec | None = None
    fleet: FleetSpec = dataclasses.field(default_factory=FleetSpec)
    # set by the loader, not keys of the file:
    source: SkipJsonSchema[Path] = Path("recipe.toml")  # the recipe file (or a synthetic path)
    raw: SkipJsonSchema[dict[str, Any]] = dataclasses.field(default_factory=dict)  # the parsed TOML

    @property
    def base_dir(self) -> Path:
        """The folder relative paths and ``module:callable`` references resolve against."""
        return self.source.parent

    @model_validator(mode="before")
    @classmethod
    def _file_defaults(cls, data: Any) -> Any:
        """Defaults that depend on other tables: the promotion metric the task's evaluation reports
        (loss for regression and embedded losses, map50 for detectors, miou for segmentation, oks_ap for
        keypoints); an empty
        optional table is none."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k in OPTIONAL_TABLES and v == {})}
        if data.get("task") == "detection" and "detection" in data:  # without the table: an error below
            data = {"loss": {"kind": "embedded"}, **data, "task": "embedded"}
        promotion = data.get("promotion", {})
        if isinstance(promotion, dict) and "metric" not in promotion:
            task, detector = data.get("task", "classification"), "detection" in data
            metric = "accuracy" if task in ACCURACY_TASKS else "map50" if detector else "loss"
            metric = TASK_METRIC.get(task, metric)
            data["promotion"] = {**promotion, "metric": metric}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        """Rules across tables: the first one broken is the error."""
        for field, expectation, got in self._inconsistencies():
            raise RecipeError(field, expectation, got, source=str(self.source))
        return self

    def _inconsistencies(self) -> Iterator[tuple[str, str, object]]:
        """Loss against task, embedded outputs, the head against the cut, what promotion and
        quantization can judge: (field, what was expected, what it holds) for each rule broken."""
        task, kind, metric = self.task, self.loss.kind, self.promotion.metric
        model, det = self.model, self.detection
        if task == "detection":
            yield (
                "detection",
                "a [detection] table (classes, scores_output, offsets_output) for task = 'detection'",
                None,
            )
        if (kind == "embedded") != (task == "embedded"):
            yield "loss.kind", "'embedded' exactly when task = 'embedded' (or 'detection')", kind
        if task == "embedded" and len(model.output_names) < 2:
            yield "model.output_names", "the loss first, then at least one model output", None
        if self.head is not None and len(model.cut_at) != 1:
            yield "head", "exactly one model.cut_at tensor to put the new head on", list(model.cut_at)
        if self.quantize is not None and task == "embedded":
            yield (
                "quantize",
                "a classification, binary or regression model (an embedded loss has no "
                "inference metric to compare float and int8 on)",
                task,
            )
        if det is not None and task != "embedded":
            yield "detection", "a detector whose loss is in its graph (task = 'embedded')", task
        if det is not None and model.num_classes not in (None, len(det.classes)):
            yield "detection.classes", f"model.num_classes ({model.num_classes}) names", list(det.classes)
        if metric in DETECTION_METRICS and det is None:
            yield (
                "promotion.metric",
                "a metric the host evaluation reports ('map50', 'map' and 'map75' need a [detection] table)",
                metric,
            )
        if metric == "accuracy" and task not in ACCURACY_TASKS:
            yield (
                "promotion.metric",
                f"a metric the host evaluation reports for task '{task}' ("
                + OTHER_METRICS.get(task, "'loss'")
                + "; accuracy needs a classification or binary task)",
                metric,
            )
        if self.promotion.significance is not None and metric not in TESTED_METRICS:
            yield (
                "promotion.significance",
                f"'off' for promotion.metric '{metric}', which has no per-sample significance test "
                f"(tested: {', '.join(TESTED_METRICS)}); with 'off' it is judged on min_gain alone, untested",
                self.promotion.significance,
            )
        if kind == "cross-entropy" and task not in ("classification", "segmentation"):
            yield (
                "loss.kind",
                f"a loss for task '{task}' (cross-entropy needs classification or segmentation)",
                kind,
            )
        yield from segmentation_rules(self)
        yield from keypoints_rules(self)
        yield from runtime_rules(self)
        yield from teacher_rules(self)
