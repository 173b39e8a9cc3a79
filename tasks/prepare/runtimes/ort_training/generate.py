"""ONNX Runtime's artifact generation for one model, shared by the full artifacts
(:mod:`.artifacts`) and the split ones of frozen-prefix caching (:mod:`.split_artifacts`): the loss
and optimizer blocks and the call itself (its log lines demoted, a refusal said in one line). What
it wrote is checked against the board's ORT by :func:`tasks.prepare.onnx_versions.check_board_loadable`
and described by :mod:`tasks.prepare.manifest`.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx

from tasks.errors import ArtifactError, RecipeError
from tasks.prepare.export.torch_model import load_ref
from tasks.prepare.export.torchscript import quiet_stderr
from tasks.prepare.losses.distillation import distillation_loss
from tasks.prepare.losses.keypoints import keypoints_loss, output_kind
from tasks.prepare.losses.segmentation import check_scores, scores_dims, segmentation_loss
from tasks.prepare.messages import generate_failure
from tasks.recipe.schema import Recipe
from tasks.recipe.segmentation import segmentation_of

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _ort_logging_to_debug() -> Iterator[None]:
    """generate_artifacts logs ~40 INFO lines on the root logger: re-log them at DEBUG here."""
    root = logging.getLogger()

    def demote(record: logging.LogRecord) -> bool:
        if "onnxruntime" in record.pathname:
            log.debug("generate_artifacts: %s", record.getMessage())
            return False
        return True

    root.addFilter(demote)
    try:
        yield
    finally:
        root.removeFilter(demote)


def _output_shapes(model: onnx.ModelProto) -> dict[str, list[Any]]:
    return {
        o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output
    }


def build_loss(recipe: Recipe, model: onnx.ModelProto) -> tuple[Any, str]:
    """The loss for generate_artifacts (LossType, onnxblock.Block or None) and its manifest name."""
    from onnxruntime.training import artifacts, onnxblock  # imports torch: only when graphs are generated

    kind, shapes = recipe.loss.kind, _output_shapes(model)
    outs = list(shapes)
    if kind == "embedded":
        if shapes[outs[0]]:
            raise RecipeError(
                "loss.kind",
                "'embedded' only for a model whose first output is a scalar loss",
                f"first output '{outs[0]}' has shape {shapes[outs[0]]}",
            )
        return None, "embedded"
    if kind == "custom":
        block = load_ref(recipe.base_dir, recipe.loss.factory or "", "loss.kind")()
        if not isinstance(block, onnxblock.Block):
            raise RecipeError(
                "loss.kind",
                "a factory returning an onnxruntime.training.onnxblock.Block",
                type(block).__name__,
            )
        return block, f"custom:{recipe.loss.factory}"
    if kind == "distillation":
        if len(outs) != 1 or len(shapes[outs[0]]) != 2:
            raise RecipeError("loss.kind", "'distillation' for a model with one [batch, classes] output",
                              f"outputs {shapes}")  # fmt: skip
        temperature = recipe.teacher.temperature if recipe.teacher else 1.0
        return distillation_loss(temperature), f"distillation (T = {temperature:g})"
    if len(outs) != 1:
        raise RecipeError(
            "loss.kind",
            f"a custom or embedded loss for a model with {len(outs)} outputs "
            f"({outs}); '{kind}' takes exactly one",
            kind,
        )
    shape = shapes[outs[0]]
    if recipe.task == "segmentation":
        spec = segmentation_of(recipe)
        dims = scores_dims(model, outs[0])
        check_scores(dims, outs[0], recipe.model.num_classes or 0, kind)
        block = segmentation_loss(
            kind, recipe.model.num_classes or 0, spec.ignore_index, spec.dice_weight, dims=dims
        )
        return block, f"{kind} (per pixel, ignore_index {spec.ignore_index})"
    if recipe.task == "keypoints" and recipe.keypoints is not None:
        spec, dims = recipe.keypoints, scores_dims(model, outs[0])
        hw = tuple(recipe.model.input_shape[-2:])
        block = keypoints_loss(spec.count, hw, spec.heatmap_sigma, dims)  # type: ignore[arg-type]
        heat = output_kind(dims, outs[0], spec.count) == "heatmaps"
        return block, f"{kind} of " + (
            f"heatmaps (Gaussian targets, sigma {spec.heatmap_sigma:g})" if heat else "coordinates"
        )
    if kind == "cross-entropy" and len(shape) > 2:
        raise RecipeError(
            "loss.kind",
            f"a loss matching output '{outs[0]}' of {len(shape)} dims (per-pixel class scores [batch, "
            f"classes, H, W] are task = \"segmentation\"; cross-entropy of task '{recipe.task}' needs "
            f"[batch, num_classes={recipe.model.num_classes}])",
            kind,
        )
    if kind == "cross-entropy" and (len(shape) != 2 or shape[1] != (recipe.model.num_classes or shape[1])):
        raise RecipeError(
            "loss.kind",
            f"a loss matching output '{outs[0]}' of shape {shape} (cross-entropy "
            f"needs [batch, num_classes={recipe.model.num_classes}])",
            kind,
        )
    loss_types = {
        "mse": "MSELoss",
        "cross-entropy": "CrossEntropyLoss",
        "bce-with-logits": "BCEWithLogitsLoss",
        "l1": "L1Loss",
    }
    return getattr(artifacts.LossType, loss_types[kind]), kind


def build_optimizer(recipe: Recipe) -> Any:
    """AdamW (with the recipe's weight decay) or SGD, for generate_artifacts."""
    from onnxruntime.training import artifacts, onnxblock  # imports torch: only when graphs are generated

    if recipe.optimizer.kind == "adamw":
        return onnxblock.optim.AdamW(weight_decay=recipe.optimizer.weight_decay)
    return artifacts.OptimType.SGD


def run_generate(
    model: onnx.ModelProto, trainable: list[str], frozen: list[str], loss: Any, recipe: Recipe, art_dir: Path
) -> None:
    """Write ORT's training, eval and optimizer graphs and checkpoint for ``model`` into ``art_dir``
    (emptied first); ArtifactError with one line (:mod:`tasks.prepare.messages`) when ORT refuses."""
    from onnxruntime.training import artifacts  # imports torch: only when graphs are generated

    extra_outputs = [] if loss is None else [o.name for o in model.graph.output]
    if art_dir.exists():
        shutil.rmtree(art_dir)
    art_dir.mkdir(parents=True)
    with _ort_logging_to_debug(), quiet_stderr("generate_artifacts"):
        try:
            artifacts.generate_artifacts(
                model,
                requires_grad=trainable,
                frozen_params=frozen,
                loss=loss,
                optimizer=build_optimizer(recipe),
                artifact_directory=art_dir,
                # keep the model's outputs beside the loss so the board can report accuracy
                additional_output_names=extra_outputs,
            )
        except Exception as exc:  # ORT raises RuntimeError, TypeError, onnx errors ...
            raise ArtifactError(generate_failure(str(exc), model, trainable)) from exc
