"""``odl prepare``: datasets -> export -> training artifacts -> offline validation, in one folder."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """Everything ``prepare`` leaves in ``out_dir`` (validation is None when it was skipped)."""

    out_dir: Path
    model_onnx: Path
    artifacts_dir: Path
    manifest_path: Path
    validation_path: Path
    manifest: dict
    validation: dict | None

    @property
    def priors(self) -> Path:
        """A detector's priors ``[P, 4]`` written beside its export (``priors.npy``)."""
        return self.out_dir / "priors.npy"


def prepare(recipe: Recipe, out_dir: Path, *, validate: bool = True) -> Prepared:
    """Generate the data if missing, export, generate artifacts and (by default) validate offline.

    Raises the stage's PipelineError subclass (RecipeError, DataError, ModelError, ArtifactError,
    ValidationFailed) on the first problem.
    """
    from tasks.prepare.artifacts import generate
    from tasks.prepare.export import export_model
    from tasks.recipe.datafiles import ensure_datasets

    out_dir = Path(out_dir).resolve()
    ensure_datasets(recipe)
    model_onnx = export_model(recipe, out_dir)
    manifest = generate(recipe, model_onnx, out_dir)
    report = None
    if validate:
        from tasks.prepare.validate import validate as run_validation

        report = run_validation(recipe, out_dir)
    return Prepared(
        out_dir=out_dir,
        model_onnx=model_onnx,
        artifacts_dir=out_dir / "artifacts",
        manifest_path=out_dir / "manifest.json",
        validation_path=out_dir / "validation.json",
        manifest=manifest,
        validation=report,
    )
