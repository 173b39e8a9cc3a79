"""Parse and validate recipe TOML files into :class:`tasks.recipe.schema.Recipe`.

Every wrong field raises :class:`tasks.errors.RecipeError` naming the field and what was
expected; unknown keys are errors. The TOML layout is documented in :mod:`tasks.recipe.schema`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
from pathlib import Path

from tasks.errors import RecipeError
from tasks.recipe.data import DATA_KEYS, parse_data
from tasks.recipe.optional import FLEET_KEYS, parse_detection, parse_fleet, parse_head, parse_quantize
from tasks.recipe.rules import ACCURACY_TASKS, check_consistency
from tasks.recipe.schema import (
    BATCHNORM_MODES,
    BUILTIN_LOSSES,
    CACHE_DTYPES,
    CACHE_STORES,
    OPTIMIZERS,
    PREFIX_CACHE,
    STRATEGIES,
    TASKS,
    LossSpec,
    ModelSpec,
    OptimizerSpec,
    PromotionSpec,
    Recipe,
    ScheduleSpec,
    TrainableSpec,
    TrainingSpec,
)
from tasks.recipe.table import Table, ref

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
TOP_KEYS = {
    "name",
    "task",
    "model",
    "trainable",
    "loss",
    "optimizer",
    "schedule",
    "training",
    "data",
    "promotion",
    "detection",
    "head",
    "quantize",
    "fleet",
}
MODEL_KEYS = {"torchvision", "callable", "onnx", "num_classes", "weights", "kwargs", "input_shape"}
MODEL_KEYS |= {"input_names", "output_names", "cut_at"}
TRAINABLE_KEYS = {"strategy", "names", "patterns", "batchnorm", "backbone", "heads", "train_from"}
DETECTION_KEYS = {"classes", "priors", "scores_output", "offsets_output", "score_threshold"}
DETECTION_KEYS |= {"iou_threshold", "max_detections"}


def _parse_model(t: Table, base: Path) -> ModelSpec:
    kinds = [k for k in ("torchvision", "callable", "onnx") if k in t.d]
    if len(kinds) != 1:
        raise t.err(
            "torchvision", "exactly one of model.torchvision, model.callable, model.onnx", kinds or None
        )
    kind = kinds[0]
    value = t.get(kind, str, what="a non-empty string")
    value = ref(t, kind, value) if kind == "callable" else value
    value = str(t.path("onnx", base)) if kind == "onnx" else value
    shape = t.get("input_shape", list, what="a list of positive integers")
    if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
        raise t.err("input_shape", "a non-empty list of positive integers (one sample, no batch axis)", shape)
    num_classes = t.get("num_classes", int, None, "an integer >= 1")
    if num_classes is not None and num_classes < 1:
        raise t.err("num_classes", "an integer >= 1", num_classes)
    if "cut_at" in t.d and kind != "onnx":
        raise t.err("cut_at", "only with model.onnx (a PyTorch model is cut in its own code)", t.d["cut_at"])
    if "cut_at" in t.d and not t.strings("cut_at"):
        raise t.err("cut_at", "a non-empty list of tensor names", t.d["cut_at"])
    if kind == "torchvision" and num_classes is None:
        raise t.err("num_classes", "an integer >= 1 (required for torchvision models)")
    return ModelSpec(
        kind=kind,
        ref=value,
        input_shape=tuple(shape),
        num_classes=num_classes,
        weights=t.path("weights", base),
        kwargs=dict(t.get("kwargs", dict, {})),
        input_names=t.strings("input_names", ("input",)),
        output_names=t.strings("output_names", ("output",)),
        cut_at=t.strings("cut_at"),
    )


def _parse_trainable(t: Table) -> TrainableSpec:
    strategy = t.get("strategy", str, None)
    if strategy is not None and strategy not in STRATEGIES:
        raise t.err("strategy", " or ".join(repr(s) for s in STRATEGIES), strategy)
    batchnorm = t.get("batchnorm", str, "frozen")
    if batchnorm not in BATCHNORM_MODES:
        raise t.err("batchnorm", " or ".join(repr(m) for m in BATCHNORM_MODES), batchnorm)
    spec = TrainableSpec(
        strategy,
        t.strings("names"),
        t.strings("patterns"),
        batchnorm,
        t.strings("backbone"),
        t.strings("heads"),
        t.get("train_from", str, None, "a node or tensor name"),
    )
    if spec.train_from == "":
        raise t.err("train_from", "a node or tensor name", "")
    if not (spec.strategy or spec.names or spec.patterns or spec.train_from):
        raise t.err(
            "strategy",
            "at least one of trainable.strategy, trainable.names, trainable.patterns, trainable.train_from",
        )
    if strategy == "freeze_net" and not spec.heads:
        raise t.err("heads", "globs of the heads' parameter names (strategy 'freeze_net' trains the heads)")
    if strategy == "freeze_basenet" and not spec.backbone:
        raise t.err(
            "backbone",
            "globs of the backbone's parameter names (strategy 'freeze_basenet' trains all but the backbone)",
        )
    return spec


def _parse_loss(t: Table) -> LossSpec:
    kind = t.get("kind", str)
    if kind in BUILTIN_LOSSES or kind == "embedded":
        return LossSpec(kind)
    if kind.startswith("custom:"):
        return LossSpec("custom", ref(t, "kind", kind.removeprefix("custom:")))
    expected = ", ".join(BUILTIN_LOSSES) + ", custom:module:factory or embedded"
    raise t.err("kind", expected, kind)


def _parse_optimizer(t: Table) -> OptimizerSpec:
    kind = t.get("kind", str, "adamw")
    if kind not in OPTIMIZERS:
        raise t.err("kind", " or ".join(repr(o) for o in OPTIMIZERS), kind)
    lr = t.number("lr", 1e-3, 0.0, 10.0)
    if lr <= 0:
        raise t.err("lr", "a number > 0", lr)
    return OptimizerSpec(kind, lr, t.number("weight_decay", 0.01, 0.0, 1.0))


def _parse_training(t: Table) -> TrainingSpec:
    return TrainingSpec(
        batch_size=t.number("batch_size", 16, 1, 65536, integer=True),
        epochs=t.number("epochs", 3, 1, 100000, integer=True),
        checkpoint_every=t.number("checkpoint_every", 0, 0, 10**9, integer=True),
        log_every=t.number("log_every", 1, 1, 10**9, integer=True),
        seed=t.number("seed", 0, 0, 2**32 - 1, integer=True),
        start_from=_choice(t, "start_from", START_FROM),
        prefix_cache=_choice(t, "prefix_cache", PREFIX_CACHE),
        cache_dtype=_choice(t, "cache_dtype", CACHE_DTYPES),
        cache_store=_choice(t, "cache_store", CACHE_STORES),
    )


START_FROM = ("base", "current")


def _choice(t: Table, key: str, allowed: tuple[str, ...]) -> str:
    val = t.get(key, str, allowed[0])
    if val not in allowed:
        raise t.err(key, " or ".join(repr(a) for a in allowed), val)
    return val


def parse_recipe(data: dict, source: Path) -> Recipe:
    """Validate a parsed TOML mapping and build the typed :class:`Recipe`."""
    src, base = str(source), Path(source).resolve().parent
    top = Table(data, "", TOP_KEYS, src)
    name = top.get("name", str)
    if not NAME_RE.match(name):
        raise top.err("name", "1-64 chars of [a-z0-9_-] starting with a letter or digit", name)
    task = top.get("task", str, "classification")
    if task not in TASKS:
        raise top.err("task", " or ".join(repr(x) for x in TASKS), task)

    def table(key: str, allowed: set[str], required: bool = True) -> Table:
        if required and key not in data:
            raise top.err(key, "a table (missing)")
        return Table(data.get(key, {}), key, allowed, src)

    recipe = Recipe(
        name=name,
        task=task,
        source=Path(source).resolve(),
        model=_parse_model(table("model", MODEL_KEYS), base),
        trainable=_parse_trainable(table("trainable", TRAINABLE_KEYS)),
        loss=_parse_loss(table("loss", {"kind"})),
        optimizer=_parse_optimizer(table("optimizer", {"kind", "lr", "weight_decay"}, False)),
        schedule=_parse_schedule(table("schedule", {"warmup_steps", "final_lr_ratio"}, False)),
        training=_parse_training(table("training", set(TrainingSpec.__dataclass_fields__), False)),
        data=parse_data(table("data", DATA_KEYS), base),
        promotion=_parse_promotion(
            table("promotion", {"metric", "min_gain", "significance", "guardrails", "rollout"}, False),
            task,
            "detection" in data,
        ),
        detection=parse_detection(table("detection", DETECTION_KEYS, False), base),
        head=parse_head(table("head", {"num_classes", "hidden", "pool", "seed"}, False)),
        quantize=parse_quantize(
            table("quantize", {"calibration", "method", "per_channel", "samples", "max_drop"}, False), base
        ),
        fleet=parse_fleet(table("fleet", FLEET_KEYS, False)),
        raw=copy.deepcopy(data),
    )
    check_consistency(recipe, src)
    return recipe


def _parse_schedule(t: Table) -> ScheduleSpec:
    return ScheduleSpec(
        t.number("warmup_steps", 0, 0, 10**9, integer=True), t.number("final_lr_ratio", 0.0, 0.0, 1.0)
    )


def _parse_promotion(t: Table, task: str, detector: bool) -> PromotionSpec:
    # regression and embedded-loss models have no accuracy to compare: they are judged on loss,
    # detectors on mAP@0.5
    default = "accuracy" if task in ACCURACY_TASKS else "map50" if detector else "loss"
    metric = t.get("metric", str, default)
    if not metric:
        raise t.err("metric", "a metric name such as 'accuracy' or 'loss'", metric)
    alpha = t.get("significance", (int, float, bool), 0.05, "a level in (0, 0.5], or false")
    if alpha is True or (alpha is not False and not 0 < alpha <= 0.5):
        raise t.err("significance", "a level in (0, 0.5], or false", alpha)
    rails = t.get("guardrails", dict, {}, 'a table of "[set.]metric" = tolerance')
    for rule, tolerance in rails.items():
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
            raise t.err("guardrails", f"a tolerance >= 0 for {rule!r}", tolerance)
    return PromotionSpec(
        metric,
        t.number("min_gain", 0.0, -1e9, 1e9),
        None if alpha is False else float(alpha),
        {k: float(v) for k, v in rails.items()},
        t.get("rollout", bool, True),
    )


def apply_overrides(data: dict, overrides: dict[str, object]) -> dict:
    """Return a copy of ``data`` with dotted keys (``training.epochs``) set to new values."""
    out = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RecipeError(dotted, f"'{part}' to be a table", node)
        node[leaf] = value
    return out


def load_recipe(path: Path | str, overrides: dict[str, object] | None = None) -> Recipe:
    """Read a recipe TOML file, apply dotted-key overrides, validate and return it."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise RecipeError("recipe", "an existing recipe file", str(path)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError("recipe", f"valid TOML ({exc})", source=str(path)) from exc
    return parse_recipe(apply_overrides(data, overrides or {}), path)


def recipe_hash(recipe: Recipe) -> str:
    """sha256 of the canonical JSON of the raw recipe (stable across key order)."""
    canon = json.dumps(recipe.raw, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()


def parse_override(text: str) -> tuple[str, object]:
    """Parse a CLI ``key=value`` override; the value is read as TOML (falls back to a string)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise RecipeError("--set", "key=value", text)
    try:
        parsed: object = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip(), parsed
