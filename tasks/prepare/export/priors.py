"""A detector's priors beside its export: ``priors.npy`` ([P, 4] center form, in [0, 1]), from
``[detection].priors`` or the model's ``priors()``, checked against its offsets output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tasks.errors import RecipeError
from tasks.recipe.schema import Recipe

PRIORS_FILE = "priors.npy"


def write_priors(recipe: Recipe, module: Any, model_onnx: Path, out: Path) -> None:
    """A detector's priors ``[P, 4]`` (center form, in [0, 1]) beside its export, checked against
    the number of priors its offsets output has: from ``[detection].priors`` or the model's
    ``priors()``. Nothing for other models."""
    spec = recipe.detection
    if spec is None:
        return
    if spec.priors is not None:
        try:
            priors = np.load(spec.priors)
        except (OSError, ValueError) as exc:
            raise RecipeError("detection.priors", "a readable .npy file of [P, 4] priors", str(exc)) from exc
        field = "detection.priors"
    else:
        if not callable(getattr(module, "priors", None)):
            raise RecipeError(
                "detection.priors",
                "a .npy file of [P, 4] center-form priors, or a model with a priors() method",
                f"{type(module).__name__} has no priors()",
            )
        priors = np.asarray(module.priors(), dtype=np.float32)
        field = f"{recipe.model.ref}.priors()"
    if priors.ndim != 2 or priors.shape[1] != 4 or not np.isfinite(priors).all():
        raise RecipeError(field, "[P, 4] finite center-form priors (cx, cy, w, h in [0, 1])", priors.shape)
    graph = onnx.load(str(model_onnx), load_external_data=False).graph
    outputs = {o.name: o for o in graph.output}
    if spec.offsets_output not in outputs:
        raise RecipeError(
            "detection.offsets_output", f"one of the model's outputs {list(outputs)}", spec.offsets_output
        )
    dims = [d.dim_value or None for d in outputs[spec.offsets_output].type.tensor_type.shape.dim]
    if len(dims) == 3 and dims[1] is not None and dims[1] != len(priors):
        raise RecipeError(
            field, f"{dims[1]} priors (the model's {spec.offsets_output} output is {dims})", len(priors)
        )
    np.save(out, priors.astype(np.float32))
