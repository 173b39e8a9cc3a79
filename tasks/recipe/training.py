"""How a recipe trains: which parameters (``[trainable]``), the loss (``[loss]``), the optimizer
and its schedule (``[optimizer]``, ``[schedule]``) and the training run (``[training]``), each
field's type, bounds, default and help written once; the flows' parameters reuse the shared types
(``Epochs``, ``BatchSize``, ``LearningRate``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field, WithJsonSchema, model_validator
from pydantic.json_schema import SkipJsonSchema

from tasks.recipe.fields import REF_PATTERN, Bool, Int, Number, Ref, Text, Texts, present, recipe_table
from tasks.recipe.messages import Expect, expected

BUILTIN_LOSSES = ("mse", "cross-entropy", "bce-with-logits", "l1")
PIXEL_LOSSES = ("dice", "cross-entropy+dice")  # task segmentation (tasks.recipe.segmentation)
Strategy = Literal["classifier", "last-conv+classifier", "suffix", "all", "freeze_net", "freeze_basenet"]
BatchNorm = Literal["frozen", "batch-stats"]
Optimizer = Literal["adamw", "sgd"]
StartFrom = Literal["base", "current"]
PrefixCache = Literal["auto", "off"]
CacheDtype = Literal["float32", "float16"]
CacheStore = Literal["auto", "ram", "disk"]
Runtime = Literal["ort-training", "autograd"]
RUNTIMES: tuple[str, ...] = get_args(Runtime)
CACHE_DTYPES: tuple[str, ...] = get_args(CacheDtype)
CACHE_STORES: tuple[str, ...] = get_args(CacheStore)
CUSTOM_LOSS = "^custom:" + REF_PATTERN.removeprefix("^")
Epochs = Annotated[Int, Field(ge=1, le=100_000, description="passes over the training set")]
BatchSize = Annotated[Int, Field(ge=1, le=65536, description="samples per training step")]
LearningRate = Annotated[Number, Field(gt=0, le=10, description="the optimizer's (peak) learning rate")]


def _loss_kind(kind: str) -> str:
    if kind in (*BUILTIN_LOSSES, *PIXEL_LOSSES, "embedded", "custom", "distillation"):
        return kind
    if re.match(CUSTOM_LOSS, kind):
        return kind
    if kind.startswith("custom:"):
        raise expected("custom:module:factory (a 'module:callable' reference after 'custom:')", got=kind)
    known = ", ".join((*BUILTIN_LOSSES, *PIXEL_LOSSES))
    raise expected(known + ", distillation, custom:module:factory or embedded", got=kind)


@recipe_table("trainable")
class TrainableSpec:
    """``[trainable]``: which parameters train; at least one of strategy / names / patterns / train_from."""

    strategy: Strategy | None = Field(
        None,
        description="classifier | last-conv+classifier (the classifier and the last feature layer "
        "before it) | suffix (everything after one cut, within max_params or max_fraction) | all | "
        "freeze_net (the heads only) | freeze_basenet (everything but the backbone)",
    )
    max_params: Int | None = Field(
        None, ge=1, description="strategy 'suffix': at most this many parameters train"
    )
    max_fraction: Number | None = Field(
        None, gt=0, le=1, description="strategy 'suffix': at most this share of the model's parameters trains"
    )
    names: Texts = Field((), description="explicit parameter (initializer) names")
    patterns: Texts = Field((), description="fnmatch globs over parameter names")
    batchnorm: BatchNorm = Field(
        "frozen",
        description="frozen: every BatchNorm normalises with its running statistics in training as at "
        "inference (scale and bias stay trainable when chosen) | batch-stats: ORT's training graph "
        "normalises with batch statistics",
    )
    batchnorm_calibration: Int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="re-measure every BatchNorm's running statistics on up to this many samples of "
        "data.train in PyTorch before export (0: keep the model's own; a PyTorch model only)",
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
        if self.strategy == "suffix" and (self.max_params is None) == (self.max_fraction is None):
            raise expected(
                "one budget for strategy 'suffix': trainable.max_params or trainable.max_fraction",
                "max_params",
            )
        if self.strategy != "suffix" and not (self.max_params is None and self.max_fraction is None):
            raise expected("strategy = 'suffix' (max_params and max_fraction are its budget)", "strategy")
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
            {
                "anyOf": [
                    {"enum": [*BUILTIN_LOSSES, *PIXEL_LOSSES, "distillation", "embedded"]},
                    {"type": "string", "pattern": CUSTOM_LOSS},
                ]
            }
        ),
    ] = Field(
        description="mse | cross-entropy | bce-with-logits | l1 | dice | cross-entropy+dice (segmentation) | "
        "distillation (soft labels of a [teacher] "
        "at its temperature) | custom:module:factory (an onnxblock loss) | embedded (the model's first "
        "output is the loss)"
    )
    factory: SkipJsonSchema[str | None] = None  # set from kind = "custom:module:factory"
    torch: Ref | None = Field(
        None,
        description="training.runtime = 'autograd' with a custom loss: its PyTorch twin, a 'module:callable' "
        "taking the model's outputs, then the loss's label feeds by their graph names, returning the loss",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_factory_key(cls, data: Any) -> Any:
        if present(data, ("factory",)):
            raise expected("a known key, this one is unknown (allowed: kind, torch)", "factory")
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
    momentum: Number = Field(
        0.0,
        ge=0,
        lt=1,
        description="sgd with training.runtime = 'autograd': torch.optim.SGD's momentum (dampening 0; "
        "ONNX Runtime's SGD has none)",
    )
    nesterov: Bool = Field(
        False, description="sgd with momentum > 0: Nesterov momentum, as torch.optim.SGD's"
    )


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
    runtime: Runtime = Field(
        "autograd",
        description="autograd: the train step from PyTorch's autograd as a plain ONNX graph any onnxruntime "
        "runs (Python 3.11-3.13 hosts, boards with or without the training API), the optimizer in numpy on "
        "the board, SGD with momentum too (an ONNX model through its PyTorch twin) | ort-training: ONNX "
        "Runtime's training graphs (onnxruntime-training on host and board: the board's own training API; "
        "a custom onnxblock loss without a PyTorch twin)",
    )


def runtime_rules(recipe: Any) -> Iterator[tuple[str, str, object]]:
    """What ``training.runtime`` and ``trainable.batchnorm_calibration`` need of the other tables:
    (field, what was expected, what it holds)."""
    autograd, loss = recipe.training.runtime == "autograd", recipe.loss
    if recipe.trainable.batchnorm_calibration and recipe.model.kind == "onnx":
        yield (
            "trainable.batchnorm_calibration",
            "0 for an ONNX model (statistics are measured in PyTorch, before export)",
            recipe.trainable.batchnorm_calibration,
        )
    if autograd and loss.kind == "custom" and loss.torch is None:
        yield (
            "loss.torch",
            f"a PyTorch twin of the custom loss {loss.factory} for training.runtime = 'autograd' (the "
            "default), or training.runtime = 'ort-training' to train with the onnxblock loss alone",
            None,
        )
    yield from _momentum_rules(recipe)
    if loss.torch is not None and loss.kind != "custom":
        yield (
            "loss.torch",
            "only with loss.kind = 'custom:module:factory' (the twin of that loss)",
            loss.torch,
        )


def _momentum_rules(recipe: Any) -> Iterator[tuple[str, str, object]]:
    """``optimizer.momentum`` and ``optimizer.nesterov``: SGD's, on the autograd runtime only."""
    optimizer = recipe.optimizer
    if optimizer.momentum > 0 and optimizer.kind != "sgd":
        yield (
            "optimizer.momentum",
            "0 with optimizer.kind = 'adamw' (momentum is SGD's)",
            optimizer.momentum,
        )
    elif optimizer.momentum > 0 and recipe.training.runtime != "autograd":
        yield (
            "optimizer.momentum",
            "0 with training.runtime = 'ort-training' (ONNX Runtime's SGD has no momentum; "
            "training.runtime = 'autograd' has it)",
            optimizer.momentum,
        )
    if optimizer.nesterov and optimizer.momentum == 0:
        yield ("optimizer.nesterov", "false unless optimizer.momentum > 0 (Nesterov needs a momentum)", True)
