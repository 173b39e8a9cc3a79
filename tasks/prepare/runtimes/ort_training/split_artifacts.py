"""The split artifacts of frozen-prefix caching: ``artifacts/split/prefix.onnx`` (forward only) and
the suffix's training, eval and optimizer graphs and checkpoint, described in the manifest's
``prefix_cache`` entry. The full-graph artifacts stay beside them: the host's dry run, base model
and evaluation use those; a board job trains the split ones when the entry says ``enabled``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tasks.prepare.manifest import file_entry
from tasks.prepare.onnx_versions import check_board_loadable
from tasks.prepare.prefix import SPLIT_DIR, find_cut, split
from tasks.prepare.rewrites.param_chains import FLOAT_TYPES
from tasks.prepare.runtimes.ort_training.generate import build_loss, run_generate
from tasks.prepare.trainable import float_params
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
SPLIT_FILES = {
    "prefix_model": f"{SPLIT_DIR}/prefix.onnx",
    "training_model": f"{SPLIT_DIR}/training_model.onnx",
    "eval_model": f"{SPLIT_DIR}/eval_model.onnx",
    "optimizer_model": f"{SPLIT_DIR}/optimizer_model.onnx",
    "checkpoint": f"{SPLIT_DIR}/checkpoint",
}


def generate_split(
    recipe: Recipe, model: onnx.ModelProto, trainable: list[str], out_dir: Path
) -> dict[str, Any]:
    """Split ``model`` (fixed up as the full artifacts were) and write the split artifacts; returns
    the manifest's ``prefix_cache`` entry (``enabled`` False with the reason when it cannot split)."""
    if recipe.training.prefix_cache == "off":
        return {"enabled": False, "reason": "training.prefix_cache = 'off'"}
    cut = find_cut(model, trainable, recipe.trainable.batchnorm)
    if cut.tensor is None:
        log.info("frozen-prefix caching off for %s: %s", recipe.name, cut.reason)
        return {"enabled": False, "reason": cut.reason}
    prefix, suffix = split(model, cut)
    kind = prefix.graph.output[0].type.tensor_type.elem_type
    if kind not in FLOAT_TYPES:  # the board keeps the prefix's outputs as float32 or float16
        reason = f"the cut tensor {cut.tensor} is {onnx.TensorProto.DataType.Name(kind).lower()}, not float"
        log.info("frozen-prefix caching off for %s: %s", recipe.name, reason)
        return {"enabled": False, "reason": reason}
    counts = float_params(suffix)
    frozen = [n for n in counts if n not in set(trainable)]
    loss, _ = build_loss(recipe, suffix)
    run_generate(suffix, trainable, frozen, loss, recipe, out_dir / SPLIT_DIR)
    onnx.save(prefix, str(out_dir / SPLIT_FILES["prefix_model"]))
    for key in ("training_model", "eval_model", "optimizer_model"):
        check_board_loadable(onnx.load(str(out_dir / SPLIT_FILES[key])), f"generated split {key}")
    shape = [d.dim_value or d.dim_param for d in prefix.graph.output[0].type.tensor_type.shape.dim]
    prefix_params = sum(int(np.prod(i.dims)) for i in prefix.graph.initializer)
    log.info(
        "frozen-prefix caching for %s: cut at %s %s (%d prefix nodes, %d suffix nodes)",
        recipe.name, cut.tensor, shape, cut.prefix_nodes, cut.suffix_nodes,
    )  # fmt: skip
    return {
        "enabled": True,
        "reason": "",
        "cut": cut.tensor,
        "feature_shape": shape,
        "prefix_inputs": [i.name for i in prefix.graph.input],
        "passthrough": list(cut.passthrough),
        "prefix_nodes": cut.prefix_nodes,
        "suffix_nodes": cut.suffix_nodes,
        "prefix_params": prefix_params,
        "suffix_frozen": frozen,
        "dtype": recipe.training.cache_dtype,
        "store": recipe.training.cache_store,
        "files": {k: file_entry(out_dir / rel, rel) for k, rel in SPLIT_FILES.items()},
    }
