"""The recipe schema: every table and key of a recipe TOML file, with its type, bounds, default and
help written once, as frozen pydantic dataclasses that every stage shares.

A recipe file is one :class:`Recipe`::

    name = "digits"
    task = "classification"
    [model]        # callable = "models:digits_cnn", input_shape = [1, 8, 8], num_classes = 10
    [trainable]    # strategy = "last-conv+classifier"
    [loss]         # kind = "cross-entropy"
    [data]         # train = "data/train.npz", test = "data/test.npz"
    # optional: [optimizer] [schedule] [training] [promotion] [fleet] [head] [quantize] [detection]

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
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, model_validator
from pydantic.json_schema import SkipJsonSchema

from device_agent.protocol import TASKS
from tasks.errors import RecipeError
from tasks.recipe.fields import (
    NAME_PATTERN,
    REF_PATTERN,
    BoardPath,
    Bool,
    FilePath,
    Int,
    Number,
    Ref,
    Text,
    Texts,
    recipe_table,
)
from tasks.recipe.messages import Expect, expected

BUILTIN_LOSSES = ("mse", "cross-entropy", "bce-with-logits", "l1")
Strategy = Literal["classifier", "last-conv+classifier", "all", "freeze_net", "freeze_basenet"]
BatchNorm = Literal["frozen", "batch-stats"]
Optimizer = Literal["adamw", "sgd"]
StartFrom = Literal["base", "current"]
PrefixCache = Literal["auto", "off"]
CacheDtype = Literal["float32", "float16"]
CacheStore = Literal["auto", "ram", "disk"]
BoardFormat = Literal["npz-shards", "image-folder"]
QuantMethod = Literal["minmax", "entropy", "percentile"]
FleetStrategy = Literal["fedavg", "fedavgm", "fedadam"]  # tasks.fleet.strategies.STRATEGIES' names
Task = Literal[TASKS]  # type: ignore[valid-type]  # the board's task names (device_agent.protocol)

CACHE_DTYPES: tuple[str, ...] = get_args(CacheDtype)
CACHE_STORES: tuple[str, ...] = get_args(CacheStore)
QUANT_METHODS: tuple[str, ...] = get_args(QuantMethod)
FLEET_STRATEGIES: tuple[str, ...] = get_args(FleetStrategy)
ACCURACY_TASKS = ("classification", "binary")
DETECTION_METRICS = ("map50", "map", "map75")
OPTIONAL_TABLES = ("head", "quantize", "detection")  # an empty table is the same as none
CUSTOM_LOSS = "^custom:" + REF_PATTERN.removeprefix("^")

# The fields the flows' parameters override: one definition of their bounds and help.
Epochs = Annotated[Int, Field(ge=1, le=100_000, description="passes over the training set")]
BatchSize = Annotated[Int, Field(ge=1, le=65536, description="samples per training step")]
LearningRate = Annotated[Number, Field(gt=0, le=10, description="the optimizer's (peak) learning rate")]
MinGain = Annotated[
    Number,
    Field(
        ge=-(10**9),
        le=10**9,
        description="promote only if new - current > min_gain (for a loss, lower is better: "
        "current - new > min_gain)",
    ),
]
Rounds = Annotated[Int, Field(ge=1, le=1000, description="federated rounds")]
MinBoards = Annotated[
    Int, Field(ge=1, le=10000, description="quorum: a round with fewer boards finishing fails the run")
]
DeadlineS = Annotated[
    Number,
    Field(
        gt=0,
        le=7 * 86400,
        description="seconds: a board not done this long after its round started is cut (a straggler)",
    ),
]


def _loss_kind(kind: str) -> str:
    if kind in (*BUILTIN_LOSSES, "embedded", "custom") or re.match(CUSTOM_LOSS, kind):
        return kind
    if kind.startswith("custom:"):
        raise expected("custom:module:factory (a 'module:callable' reference after 'custom:')", got=kind)
    raise expected(", ".join(BUILTIN_LOSSES) + ", custom:module:factory or embedded", got=kind)


def _distinct(classes: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(classes)) != len(classes):
        raise expected("a non-empty list of distinct object class names", got=list(classes))
    return classes


def _no_test(value: Any) -> Any:
    """``significance = false``: no significance test (None)."""
    if value is True:
        raise expected("a level in (0, 0.5], or false", got=value)
    return None if value is False else value


def _present(data: Any, keys: tuple[str, ...]) -> list[str]:
    """The ``keys`` a table gives in the file (a before-validator sees the TOML table as a dict)."""
    return [k for k in keys if isinstance(data, dict) and k in data]


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
        None, description="classes of the model's output; torchvision: its new classifier head (required)"
    )
    weights: FilePath | None = Field(None, description="a local state_dict file to load")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the callable / torchvision builder"
    )
    input_names: Texts = Field(("input",), description="the model's input names")
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
        sources = _present(data, ("torchvision", "callable", "onnx"))
        if isinstance(data, dict) and len(sources) != 1:  # what the model is comes before its fields
            raise expected(
                "exactly one of model.torchvision, model.callable, model.onnx", "torchvision", sources or None
            )
        if _present(data, ("cut_at",)) and data["cut_at"] == []:
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


@recipe_table("trainable")
class TrainableSpec:
    """``[trainable]``: which parameters train; at least one of strategy / names / patterns / train_from."""

    strategy: Strategy | None = Field(
        None,
        description="classifier | last-conv+classifier | all | freeze_net (the heads only) | "
        "freeze_basenet (everything but the backbone)",
    )
    names: Texts = Field((), description="explicit parameter (initializer) names")
    patterns: Texts = Field((), description="fnmatch globs over parameter names")
    batchnorm: BatchNorm = Field(
        "frozen",
        description="frozen: every BatchNorm normalises with its running statistics in training as at "
        "inference (scale and bias stay trainable when chosen) | batch-stats: ORT's training graph "
        "normalises with batch statistics",
    )
    backbone: Texts = Field((), description="fnmatch globs: the backbone's parameters (freeze_basenet)")
    heads: Texts = Field((), description="fnmatch globs: the heads' parameters (freeze_net)")
    train_from: Annotated[Text, Expect("a node or tensor name")] | None = Field(
        None,
        description="an ONNX node or tensor name: nothing before it receives gradients (a [head] is "
        "always after it)",
    )

    @model_validator(mode="after")
    def _something_trains(self) -> TrainableSpec:
        if not (self.strategy or self.names or self.patterns or self.train_from):
            raise expected(
                "at least one of trainable.strategy, trainable.names, trainable.patterns, trainable.train_from",
                "strategy",
            )
        if self.strategy == "freeze_net" and not self.heads:
            raise expected(
                "globs of the heads' parameter names (strategy 'freeze_net' trains the heads)", "heads"
            )
        if self.strategy == "freeze_basenet" and not self.backbone:
            raise expected(
                "globs of the backbone's parameter names (strategy 'freeze_basenet' trains all but the "
                "backbone)",
                "backbone",
            )
        return self


@recipe_table("loss")
class LossSpec:
    """``[loss]``: one of the four ORT losses, a custom onnxblock loss, or the model's first output."""

    kind: Annotated[
        str,
        AfterValidator(_loss_kind),
        WithJsonSchema(
            {"anyOf": [{"enum": [*BUILTIN_LOSSES, "embedded"]}, {"type": "string", "pattern": CUSTOM_LOSS}]}
        ),
    ] = Field(
        description="mse | cross-entropy | bce-with-logits | l1 | custom:module:factory (an onnxblock "
        "loss) | embedded (the model's first output is the loss)"
    )
    factory: SkipJsonSchema[str | None] = None  # set from kind = "custom:module:factory"

    @model_validator(mode="before")
    @classmethod
    def _no_factory_key(cls, data: Any) -> Any:
        if _present(data, ("factory",)):
            raise expected("a known key, this one is unknown (allowed: kind)", "factory")
        return data

    @model_validator(mode="after")
    def _custom(self) -> LossSpec:
        """``custom:module:factory`` becomes kind ``custom`` with its ``factory``."""
        if self.kind.startswith("custom:"):
            object.__setattr__(self, "factory", self.kind.removeprefix("custom:"))
            object.__setattr__(self, "kind", "custom")
        if (self.kind == "custom") != (self.factory is not None):
            raise expected("custom:module:factory (a 'module:callable' reference)", "kind", self.kind)
        return self


@recipe_table("optimizer")
class OptimizerSpec:
    """``[optimizer]``."""

    kind: Optimizer = Field("adamw", description="adamw | sgd")
    lr: LearningRate = 1e-3
    weight_decay: Number = Field(0.01, ge=0, le=1, description="adamw only")


@recipe_table("schedule")
class ScheduleSpec:
    """``[schedule]``: linear warmup, then linear decay to lr * final_lr_ratio at the last step."""

    warmup_steps: Int = Field(0, ge=0, le=10**9, description="steps of linear warmup")
    final_lr_ratio: Number = Field(
        0.0, ge=0, le=1, description="the last step's learning rate, as a share of lr"
    )


@recipe_table("training")
class TrainingSpec:
    """``[training]``: the board's training loop."""

    batch_size: BatchSize = 16
    epochs: Epochs = 3
    checkpoint_every: Int = Field(
        0, ge=0, le=10**9, description="steps between checkpoints; 0 = epoch ends only"
    )
    log_every: Int = Field(1, ge=1, le=10**9, description="steps between progress events")
    seed: Int = Field(0, ge=0, le=2**32 - 1, description="seed of the shuffling")
    start_from: StartFrom = Field(
        "base",
        description="base: the recipe's weights | current: the weights of the model in service for this "
        "recipe and board (warm start)",
    )
    prefix_cache: PrefixCache = Field(
        "auto",
        description="auto: when every trainable parameter follows one tensor and the part before it is "
        "deterministic, the board runs that frozen prefix once per sample and trains the rest on its "
        "cached outputs (same results) | off",
    )
    cache_dtype: CacheDtype = Field("float32", description="float32 (exact) | float16 (half the memory)")
    cache_store: CacheStore = Field(
        "auto", description="auto (RAM when it fits half the free RAM, else disk) | ram | disk"
    )


@recipe_table("data")
class DataSpec:
    """``[data]``: exactly one training source (``train``, ``board_train`` or ``board_dataset``) and the
    host's test set."""

    test: FilePath = Field(description="host test set for the before/after evaluation")
    train: FilePath | None = Field(None, description="host file uploaded to the board (content-addressed)")
    board_train: BoardPath | None = Field(None, description="or a file already on the board")
    eval: FilePath | None = Field(None, description="evaluated on the board each epoch")
    extra_tests: dict[str, FilePath] = Field(
        default_factory=dict, description="named extra host test sets (e.g. clean = ...)"
    )
    make: Ref | None = Field(
        None, description="module:callable(out_dir: Path) writing the npz files above when they are missing"
    )
    feeds: Annotated[dict[str, str], Expect("a table of model input name = npz key (strings)")] = Field(
        default_factory=dict, description="model input name = npz key (default: x, y)"
    )
    board_dataset: BoardPath | None = Field(
        None,
        description="or a folder on the board that grows (npz shards or class folders of images); the job "
        "pins its files by sha256",
    )
    board_format: BoardFormat = Field("npz-shards", description="board_dataset: npz-shards | image-folder")
    board_select: Annotated[str, Expect("'all', 'new+replay' or a registry version such as 'v0003'")] = Field(
        "all",
        pattern=r"^(all|new\+replay|v\d{4,})$",
        description="board_dataset: all | new+replay (files the model in service never saw, plus older "
        'ones) | a registry version such as "v0003" (its exact files)',
    )
    replay: Number = Field(
        0.0, ge=0, le=0.95, description="new+replay: the share of older samples in the mix"
    )

    @model_validator(mode="before")
    @classmethod
    def _folder_keys(cls, data: Any) -> Any:
        given = _present(data, ("board_format", "board_select", "replay"))
        if given and not _present(data, ("board_dataset",)):
            raise expected("data.board_dataset too (it applies to a board dataset folder)", given[0])
        return data

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        sources = [k for k in ("train", "board_train", "board_dataset") if getattr(self, k) is not None]
        if len(sources) != 1:
            raise expected(
                "exactly one of data.train (host file), data.board_train (a file on the board) or "
                f"data.board_dataset (a folder on the board that grows) (got {sources or 'none'})",
                "train",
            )
        if self.replay > 0 and self.board_select != "new+replay":
            raise expected('0 unless data.board_select = "new+replay"', "replay", self.replay)
        return self


@recipe_table("head")
class HeadSpec:
    """``[head]``: with one ``model.cut_at`` tensor, a new head on it."""

    num_classes: Int = Field(ge=1, le=100000, description="a Linear to num_classes outputs")
    hidden: Int = Field(0, ge=0, le=100000, description="> 0: a hidden Linear + ReLU of this width first")
    pool: Literal["auto", "none"] = Field(
        "auto", description="auto: global average pool + flatten a 4-D cut tensor | none: flatten only"
    )
    seed: Int = Field(0, ge=0, le=2**31 - 1, description="seeded initialisation (as torch.nn.Linear)")


@recipe_table("quantize")
class QuantizeSpec:
    """``[quantize]``: a static int8 QDQ model for the NPU."""

    calibration: FilePath = Field(description="host set (x) the activation ranges are calibrated on")
    method: QuantMethod = Field("minmax", description="minmax | entropy | percentile")
    per_channel: Bool = Field(True, description="per-channel weight scales")
    samples: Int = Field(128, ge=1, le=10**6, description="calibration samples used (the first ones)")
    max_drop: Annotated[Number, Field(ge=0)] | None = Field(
        None,
        description="promotion also needs the int8 model's promotion metric within max_drop of the float one",
    )


@recipe_table("detection")
class DetectionSpec:
    """``[detection]``, task embedded only: the model is a detector; the host decodes, runs per-class
    NMS and reports COCO mAP (the test set also holds gt_boxes [N, M, 4] and gt_labels [N, M])."""

    classes: Annotated[
        Texts,
        AfterValidator(_distinct),
        Expect("a non-empty list of distinct object class names"),
        WithJsonSchema(
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "uniqueItems": True}
        ),
    ] = Field(min_length=1, description="object class names (class id 0 is the background)")
    priors: FilePath | None = Field(
        None, description="[P, 4] center-form priors in [0, 1]; default: the model's priors() at export"
    )
    scores_output: str = Field("scores", description="inference output: [N, P, C + 1] class probabilities")
    offsets_output: str = Field(
        "offsets", description="inference output: [N, P, 4] offsets (variances 0.1 / 0.2)"
    )
    score_threshold: Number = Field(0.01, ge=0, le=1, description="detections below are dropped")
    iou_threshold: Number = Field(0.45, gt=0, le=1, description="per-class NMS")
    max_detections: Int = Field(100, ge=1, le=10000, description="per image")


@recipe_table("fleet")
class FleetSpec:
    """``[fleet]``: federated rounds over a group of boards (the fleet flow, deployment ``odl/fleet``)."""

    rounds: Rounds = 3
    min_boards: MinBoards = 1
    deadline_s: DeadlineS = 1800.0
    strategy: FleetStrategy = Field("fedavg", description="fedavg | fedavgm (server momentum) | fedadam")
    server_lr: Number = Field(
        1.0, gt=0, le=100, description="step on the aggregate: 1.0 = plain FedAvg (default 0.03 for fedadam)"
    )
    momentum: Number = Field(0.9, ge=0, le=0.999999, description="fedavgm: server momentum; fedadam: beta1")
    beta2: Number = Field(0.99, ge=0, le=0.999999, description="fedadam")
    tau: Number = Field(1e-3, ge=1e-12, le=10, description="fedadam: adaptivity (Adam's epsilon)")

    @model_validator(mode="before")
    @classmethod
    def _adam_lr(cls, data: Any) -> Any:
        """A [fleet] table of fedadam without server_lr steps 0.03 (Adam's step size)."""
        if isinstance(data, dict) and data.get("strategy") == "fedadam" and "server_lr" not in data:
            return {**data, "server_lr": 0.03}
        return data


@recipe_table("promotion")
class PromotionSpec:
    """``[promotion]``: when a trained model replaces the one in service."""

    metric: Annotated[Text, Expect("a metric name such as 'accuracy' or 'loss'")] = Field(
        "accuracy",
        description="any metric the evaluator reports: accuracy | loss | map50 | map | ...; default accuracy "
        "for classification/binary, map50 for detectors, else loss",
    )
    min_gain: MinGain = 0.0
    significance: Annotated[
        Annotated[Number, Field(gt=0, le=0.5)] | None,
        BeforeValidator(_no_test),
        WithJsonSchema(
            {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}, {"const": False}]}
        ),
        Expect("a level in (0, 0.5], or false"),
    ] = Field(
        0.05,
        description="the gain must also be significant at this level on the paired test set (McNemar for "
        "accuracy, paired bootstrap for losses); false: no test",
    )
    guardrails: Annotated[
        dict[str, Annotated[Number, Field(ge=0)]], Expect('a table of "[set.]metric" = tolerance >= 0')
    ] = Field(
        default_factory=dict,
        description='"[set.]metric" = the regression each may show (absolute) against the reference',
    )
    rollout: Bool = Field(
        True, description="install a promoted model on the board (models/<recipe>/current.onnx)"
    )


@recipe_table("")
class Recipe:
    """A recipe file: what to train, how, on which data, and when to promote the result."""

    name: Annotated[str, Expect("1-64 chars of [a-z0-9_-] starting with a letter or digit")] = Field(
        pattern=NAME_PATTERN, description="names runs and registry folders"
    )
    task: Task = Field(
        "classification",
        description="classification | binary | regression | embedded (the loss is in the model)",
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
    head: HeadSpec | None = None
    quantize: QuantizeSpec | None = None
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
        (loss for regression and embedded losses, map50 for detectors); an empty optional table is none."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k in OPTIONAL_TABLES and v == {})}
        promotion = data.get("promotion", {})
        if isinstance(promotion, dict) and "metric" not in promotion:
            task, detector = data.get("task", "classification"), "detection" in data
            metric = "accuracy" if task in ACCURACY_TASKS else "map50" if detector else "loss"
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
        if (kind == "embedded") != (task == "embedded"):
            yield "loss.kind", "'embedded' exactly when task = 'embedded'", kind
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
                f"a metric the host evaluation reports for task '{task}' ('loss'; "
                "accuracy needs a classification or binary task)",
                metric,
            )
        if kind == "cross-entropy" and task != "classification":
            yield "loss.kind", f"a loss for task '{task}' (cross-entropy needs classification)", kind
