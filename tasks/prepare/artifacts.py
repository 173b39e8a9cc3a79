"""Generate ONNX Runtime training artifacts for a recipe and describe them in ``manifest.json``.

``generate`` resolves the trainable parameters from the recipe (names, glob patterns, strategies
found by walking the graph back from its outputs), applies the BatchNorm fix of FACTS.md, builds
the loss (built-in, custom onnxblock, or embedded) and optimizer, refuses models a board with
ORT 1.19.2 could not load (IR > 10, opset > 21), and writes the manifest with hashes and sizes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx

from tasks.errors import ArtifactError, RecipeError
from tasks.hashing import file_sha256
from tasks.prepare.batchnorm import batchnorm_after_trainable, fix_batchnorm
from tasks.prepare.export import check_onnx, feed_keys, load_onnx, quiet_stderr
from tasks.prepare.fixups import apply_all
from tasks.prepare.messages import generate_failure
from tasks.prepare.split_artifacts import generate_split
from tasks.prepare.trainable import float_params, resolve_trainable
from tasks.recipe.load import recipe_hash
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
MAX_IR = 10
MAX_OPSET = 21
ARTIFACT_FILES = {
    "training_model": "artifacts/training_model.onnx",
    "eval_model": "artifacts/eval_model.onnx",
    "optimizer_model": "artifacts/optimizer_model.onnx",
    "checkpoint": "artifacts/checkpoint",
}


def onnx_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset a model imports."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def check_board_loadable(model: onnx.ModelProto, what: str) -> None:
    """ArtifactError if ORT 1.19.2 (the board's) could not load ``model`` (IR > 10 or opset > 21)."""
    if model.ir_version > MAX_IR:
        raise ArtifactError(
            f"{what} has ONNX IR version {model.ir_version}; ORT 1.19.2 on the board loads "
            f"IR <= {MAX_IR} (was it written by onnx >= 1.18? pin onnx==1.17.0)"
        )
    if onnx_opset(model) > MAX_OPSET:
        raise ArtifactError(
            f"{what} uses opset {onnx_opset(model)}; ORT 1.19.2 on the board supports "
            f"opset <= {MAX_OPSET} (export with opset 17)"
        )


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
    from onnxruntime.training import artifacts, onnxblock

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
        from tasks.prepare.torch_model import load_ref

        block = load_ref(recipe.base_dir, recipe.loss.factory or "", "loss.kind")()
        if not isinstance(block, onnxblock.Block):
            raise RecipeError(
                "loss.kind",
                "a factory returning an onnxruntime.training.onnxblock.Block",
                type(block).__name__,
            )
        return block, f"custom:{recipe.loss.factory}"
    if len(outs) != 1:
        raise RecipeError(
            "loss.kind",
            f"a custom or embedded loss for a model with {len(outs)} outputs "
            f"({outs}); '{kind}' takes exactly one",
            kind,
        )
    shape = shapes[outs[0]]
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
    from onnxruntime.training import artifacts, onnxblock

    if recipe.optimizer.kind == "adamw":
        return onnxblock.optim.AdamW(weight_decay=recipe.optimizer.weight_decay)
    return artifacts.OptimType.SGD


def file_entry(path: Path, rel: str) -> dict[str, Any]:
    """``{"path", "sha256", "size"}`` for one file."""
    return {"path": rel, "sha256": file_sha256(path), "size": path.stat().st_size}


def _run_generate(
    model: onnx.ModelProto, trainable: list[str], frozen: list[str], loss: Any, recipe: Recipe, art_dir: Path
) -> None:
    from onnxruntime.training import artifacts

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


def training_inputs(eval_model: onnx.ModelProto, params: set[str]) -> list[str]:
    """The inputs the training/eval graphs need fed per batch (model inputs and loss labels)."""
    inits = {i.name for i in eval_model.graph.initializer}
    return [i.name for i in eval_model.graph.input if i.name not in params and i.name not in inits]


def generate(recipe: Recipe, model_onnx: Path, out_dir: Path, *, bn_fix: bool = True) -> dict:
    """Write ``out_dir/artifacts/*`` and ``out_dir/manifest.json`` for the recipe; return the manifest.

    ``bn_fix=False`` skips the BatchNorm fix (only to show what it is for: eval_model then fails to load).
    """
    out_dir = Path(out_dir)
    with quiet_stderr("import onnxruntime.training"):  # imports torch, which prints a CUDA warning
        import onnxruntime.training.artifacts  # noqa: F401
    model = load_onnx(Path(model_onnx))
    check_board_loadable(model, str(model_onnx))
    check_onnx(Path(model_onnx), model)
    out_dir.mkdir(parents=True, exist_ok=True)
    local = out_dir / "model.onnx"
    if Path(model_onnx).resolve() != local.resolve():
        shutil.copyfile(model_onnx, local)
    if bn_fix:
        fix_batchnorm(model)
    trainable, _, _ = resolve_trainable(recipe, model)
    fixed = apply_all(model, trainable, batchnorm=recipe.trainable.batchnorm)
    counts = float_params(model)
    frozen = [n for n in counts if n not in set(trainable)]
    loss, loss_name = build_loss(recipe, model)
    fixed_model = onnx.ModelProto()
    fixed_model.CopyFrom(model)  # generate_artifacts may change the proto it is given
    _run_generate(model, trainable, frozen, loss, recipe, out_dir / "artifacts")
    for key in ("training_model", "eval_model", "optimizer_model"):
        check_board_loadable(onnx.load(str(out_dir / ARTIFACT_FILES[key])), f"generated {key}")
    manifest = _manifest(recipe, model, out_dir, trainable, frozen, counts, loss_name)
    manifest["fixups"] = fixed.counts
    manifest["batchnorm"] = recipe.trainable.batchnorm
    manifest["prefix_cache"] = generate_split(recipe, fixed_model, trainable, out_dir)
    stale_bn = batchnorm_after_trainable(model, trainable)
    if stale_bn:
        manifest["warnings"].append(
            f"{len(stale_bn)} BatchNorm layer(s) follow trainable parameters ({', '.join(stale_bn[:3])}"
            f"{', ...' if len(stale_bn) > 3 else ''}): with trainable.batchnorm = 'batch-stats' the board trains them "
            "on batch statistics and never updates the running statistics the exported model uses; "
            "'frozen' (the default) trains what the board exports"
        )
        log.warning("%s", manifest["warnings"][-1])
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    log.info(
        "artifacts for %s: %d trainable tensors (%d params), %d frozen, BatchNorm %s; fix-ups: %s",
        recipe.name,
        len(trainable),
        manifest["trainable_count"],
        len(frozen),
        recipe.trainable.batchnorm,
        ", ".join(f"{k} {v}" for k, v in fixed.counts.items()) or "none",
    )
    return manifest


def _manifest(
    recipe: Recipe,
    model: onnx.ModelProto,
    out_dir: Path,
    trainable: list[str],
    frozen: list[str],
    counts: dict[str, int],
    loss_name: str,
) -> dict[str, Any]:
    import onnxruntime

    files = {k: file_entry(out_dir / rel, rel) for k, rel in ARTIFACT_FILES.items()}
    files["model"] = file_entry(out_dir / "model.onnx", "model.onnx")
    eval_model = onnx.load(str(out_dir / ARTIFACT_FILES["eval_model"]))
    feeds = training_inputs(eval_model, set(trainable) | set(frozen))
    outputs = [o.name for o in model.graph.output]
    return {
        "files": files,
        "trainable": trainable,
        "frozen": frozen,
        "trainable_count": sum(counts[n] for n in trainable),
        "frozen_count": sum(counts[n] for n in frozen),
        "opset": onnx_opset(model),
        "ir_version": model.ir_version,
        "ort_version": onnxruntime.__version__,
        "loss": loss_name,
        "input_names": [i.name for i in model.graph.input if i.name not in counts],
        "output_names": outputs,
        "inference_output_names": outputs[1:] if recipe.loss.kind == "embedded" else outputs,
        "feeds": feed_keys(recipe, feeds),
        "recipe_hash": recipe_hash(recipe),
        "warnings": [],
    }
