"""Rehearsals, in validation, of what happens to a job's files after the board has trained.

Retrieval joins the frozen prefix to the trained suffix's inference model
(:func:`tasks.prepare.prefix.stitch`). Validation does the same join with the suffix the probe
exported from the base weights and compares it with the full graph's inference model on a few
samples: a join that would fail, or compute something else, stops ``odl prepare`` before any board
time is spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import ArtifactError, ValidationFailed
from tasks.prepare.feeds import example_arrays
from tasks.prepare.prefix import stitch
from tasks.recipe.schema import Recipe

JOIN_TOL = 1e-3  # relative to the outputs' scale: the joined and the full graph fuse float32 ops differently (as SPLIT_TOL)
JOIN_SAMPLES = 8
INFERENCE_FILES = {"full": "validation_full_base.onnx", "suffix": "validation_suffix_base.onnx"}


def inference_paths(out_dir: Path) -> dict[str, str]:
    """Where the probe writes the base-weights inference models of the full and the split graph."""
    return {key: str(Path(out_dir) / name) for key, name in INFERENCE_FILES.items()}


def check_join(recipe: Recipe, out_dir: Path, manifest: dict) -> dict[str, Any] | str:
    """Join the split prefix to the probe's untrained suffix as retrieval will, and compare the
    joined model with the full one on ``JOIN_SAMPLES`` samples; ValidationFailed when the join fails
    or differs. A note when the recipe trains unsplit. The rehearsal's files are removed."""
    cache = manifest.get("prefix_cache") or {}
    if not cache.get("enabled"):
        return "no frozen-prefix split: retrieval keeps the board's inference model as it is"
    if manifest.get("runtime") == "autograd":
        return "the autograd runtime's board writes the whole inference model (its template holds the prefix)"
    out_dir = Path(out_dir)
    paths = {k: Path(v) for k, v in inference_paths(out_dir).items()}
    joined = out_dir / "validation_joined.onnx"
    try:
        stitch(out_dir / cache["files"]["prefix_model"]["path"], paths["suffix"], joined)
        got, want = _outputs(recipe, joined, manifest), _outputs(recipe, paths["full"], manifest)
    except ArtifactError as exc:
        raise ValidationFailed(
            "join_matches_full",
            f"retrieval could not join the frozen prefix and the trained suffix: {exc}; "
            "set training.prefix_cache = 'off' to train and export the full graph",
        ) from exc
    finally:
        for path in (*paths.values(), joined):
            path.unlink(missing_ok=True)
    scale = max(1.0, *(float(np.abs(w).max()) for w in want))
    diff = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
    if not diff <= JOIN_TOL * scale:
        raise ValidationFailed(
            "join_matches_full",
            f"the prefix joined to the suffix computes outputs {diff:.3g} away from the full graph's "
            f"(tolerance {JOIN_TOL * scale:.3g}); set training.prefix_cache = 'off'",
        )
    return {"max_abs_diff": diff, "tolerance": JOIN_TOL * scale, "samples": len(want[0])}


def _outputs(recipe: Recipe, model: Path, manifest: dict) -> list[np.ndarray]:
    from tasks.quiet import ort_session  # onnxruntime (heavy); validation has loaded it already

    sess = ort_session(str(model))  # errors only: no optimizer warning of ONNX Runtime's printed
    names = tuple(i.name for i in sess.get_inputs())
    arrays = example_arrays(recipe, names, n=JOIN_SAMPLES)
    return sess.run(manifest["inference_output_names"], dict(zip(names, arrays, strict=True)))
