"""Host-side preparation of a recipe's job; :class:`Prepared` is what it leaves in a folder.

The steps are this package's modules and folders (``datasets`` -> ``export/`` -> ``runtimes/`` ->
``validation/``; ``rewrites/`` fix graphs up, ``sandbox/`` runs ONNX Runtime in child processes);
:func:`tasks.prepare.pipeline.prepare` runs them, cached per input hash or not. This module stays
light (no onnx, no torch): the torch-free training probe (``python -m tasks.prepare.validation.ort_probe``)
imports it first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# the manifest's ``files`` key of each training runtime's train and eval graph
GRAPH_FILES = {
    "ort-training": {"train": "training_model", "eval": "eval_model"},
    "autograd": {"train": "train_step", "eval": "eval_step"},
}


def graph_file(manifest: dict, role: str) -> str:
    """The path, relative to the prepared folder, of the ``role`` graph ("train" or "eval") of the
    manifest's runtime."""
    return manifest["files"][GRAPH_FILES[manifest.get("runtime", "ort-training")][role]]["path"]


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

    @classmethod
    def of(cls, out_dir: Path, manifest: dict, validation: dict | None) -> Prepared:
        """The prepared folder ``out_dir``: its files by their fixed names, its manifest and its
        validation report (None when validation was skipped)."""
        return cls(
            out_dir=out_dir,
            model_onnx=out_dir / "model.onnx",
            artifacts_dir=out_dir / "artifacts",
            manifest_path=out_dir / "manifest.json",
            validation_path=out_dir / "validation.json",
            manifest=manifest,
            validation=validation,
        )

    @property
    def checkpoint(self) -> Path:
        """The prepared (untrained) checkpoint, as the manifest's runtime writes it."""
        return self.out_dir / self.manifest["files"]["checkpoint"]["path"]

    @property
    def priors(self) -> Path:
        """A detector's priors ``[P, 4]`` written beside its export (``priors.npy``)."""
        return self.out_dir / "priors.npy"
