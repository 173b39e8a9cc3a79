"""Cross-field rules of a recipe, checked after every table parsed: loss against task, embedded
outputs, the head against the cut, what promotion and quantization can judge."""

from __future__ import annotations

from tasks.errors import RecipeError
from tasks.recipe.schema import Recipe

ACCURACY_TASKS = ("classification", "binary")


DETECTION_METRICS = ("map50", "map", "map75")


def check_consistency(r: Recipe, src: str) -> None:
    """Cross-field rules: loss vs task, embedded output names, feeds naming real inputs."""
    if (r.loss.kind == "embedded") != (r.task == "embedded"):
        raise RecipeError("loss.kind", "'embedded' exactly when task = 'embedded'", r.loss.kind, source=src)
    if r.task == "embedded" and len(r.model.output_names) < 2:
        raise RecipeError("model.output_names", "the loss first, then at least one model output", source=src)
    if r.head is not None and len(r.model.cut_at) != 1:
        raise RecipeError(
            "head", "exactly one model.cut_at tensor to put the new head on", list(r.model.cut_at), source=src
        )
    if r.quantize is not None and r.task == "embedded":
        raise RecipeError(
            "quantize",
            "a classification, binary or regression model (an embedded loss has no inference metric "
            "to compare float and int8 on)",
            r.task,
            source=src,
        )
    if r.detection is not None and r.task != "embedded":
        raise RecipeError(
            "detection", "a detector whose loss is in its graph (task = 'embedded')", r.task, source=src
        )
    if r.detection is not None and r.model.num_classes not in (None, len(r.detection.classes)):
        raise RecipeError(
            "detection.classes",
            f"model.num_classes ({r.model.num_classes}) names",
            list(r.detection.classes),
            source=src,
        )
    if r.promotion.metric in DETECTION_METRICS and r.detection is None:
        raise RecipeError(
            "promotion.metric",
            "a metric the host evaluation reports ('map50', 'map' and 'map75' need a [detection] table)",
            r.promotion.metric,
            source=src,
        )
    if r.promotion.metric == "accuracy" and r.task not in ACCURACY_TASKS:
        raise RecipeError(
            "promotion.metric",
            f"a metric the host evaluation reports for task '{r.task}' ('loss'; accuracy needs a "
            "classification or binary task)",
            r.promotion.metric,
            source=src,
        )
    if r.loss.kind == "cross-entropy" and r.task != "classification":
        raise RecipeError(
            "loss.kind",
            f"a loss for task '{r.task}' (cross-entropy needs classification)",
            r.loss.kind,
            source=src,
        )
