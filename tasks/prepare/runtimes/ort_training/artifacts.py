"""Generate ONNX Runtime training artifacts for a recipe and describe them in ``manifest.json``.

``generate`` resolves the trainable parameters from the recipe (names, glob patterns, strategies
found by walking the graph back from its outputs), applies the BatchNorm fix of FACTS.md, builds
the loss (built-in, custom onnxblock, or embedded) and optimizer, refuses models a board with
ORT 1.19.2 could not load (IR > 10, opset > 21), and writes the manifest with hashes and sizes.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import onnx

from tasks.prepare.export.torchscript import check_onnx, load_onnx, quiet_stderr
from tasks.prepare.feeds import feed_keys
from tasks.prepare.graph import annotate_shapes
from tasks.prepare.manifest import common_manifest, trainable_layers
from tasks.prepare.onnx_versions import check_board_loadable
from tasks.prepare.rewrites.batchnorm import batchnorm_after_trainable, fix_batchnorm
from tasks.prepare.rewrites.fixups import apply_all
from tasks.prepare.rewrites.param_chains import split_shared_initializers
from tasks.prepare.runtimes.ort_training.generate import build_loss, run_generate
from tasks.prepare.runtimes.ort_training.split_artifacts import generate_split
from tasks.prepare.trainable import float_params, model_parameter_count, resolve_trainable
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
ARTIFACT_FILES = {
    "training_model": "artifacts/training_model.onnx",
    "eval_model": "artifacts/eval_model.onnx",
    "optimizer_model": "artifacts/optimizer_model.onnx",
    "checkpoint": "artifacts/checkpoint",
}


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
        import onnxruntime.training.artifacts  # noqa: F401 - torch loads here, its warning hidden
    model = load_onnx(Path(model_onnx))
    check_board_loadable(model, str(model_onnx))
    check_onnx(Path(model_onnx), model)
    out_dir.mkdir(parents=True, exist_ok=True)
    local = out_dir / "model.onnx"
    if split_shared_initializers(model):  # parameters the exporter merged train apart, as in PyTorch
        onnx.save(model, str(local.with_suffix(".split.tmp")))
        local.with_suffix(".split.tmp").replace(local)
    elif Path(model_onnx).resolve() != local.resolve():
        shutil.copyfile(model_onnx, local)
    if bn_fix:
        fix_batchnorm(model)
    trainable, _, all_counts = resolve_trainable(recipe, model)
    layers = trainable_layers(model, trainable, all_counts)
    model_params = model_parameter_count(model)
    fixed = apply_all(model, trainable, batchnorm=recipe.trainable.batchnorm)
    annotate_shapes(model)  # gradient kernels size their results from the graph's shapes
    counts = float_params(model)
    frozen = [n for n in counts if n not in set(trainable)]
    loss, loss_name = build_loss(recipe, model)
    fixed_model = onnx.ModelProto()
    fixed_model.CopyFrom(model)  # generate_artifacts may change the proto it is given
    run_generate(model, trainable, frozen, loss, recipe, out_dir / "artifacts")
    for key in ("training_model", "eval_model", "optimizer_model"):
        check_board_loadable(onnx.load(str(out_dir / ARTIFACT_FILES[key])), f"generated {key}")
    manifest = _manifest(recipe, model, out_dir, trainable, frozen, counts, loss_name)
    manifest["fixups"] = fixed.counts
    manifest["trainable_layers"] = layers
    manifest["model_params"] = model_params
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
    eval_model = onnx.load(str(out_dir / ARTIFACT_FILES["eval_model"]))
    feeds = training_inputs(eval_model, set(trainable) | set(frozen))
    outputs = [o.name for o in model.graph.output]
    return common_manifest(recipe, out_dir, ARTIFACT_FILES, model, trainable, frozen, counts, loss_name) | {
        "input_names": [i.name for i in model.graph.input if i.name not in counts],
        "output_names": outputs,
        "inference_output_names": outputs[1:] if recipe.loss.kind == "embedded" else outputs,
        "feeds": feed_keys(recipe, feeds),
    }
