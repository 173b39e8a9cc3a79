"""Training runtimes: how a recipe's training graphs are built (``[training] runtime``), one
interface for both.

* ``ort-training`` (the default): the training-mode TorchScript export
  (:func:`tasks.prepare.export.torchscript.export_model`) and ONNX Runtime's training artifacts
  (:func:`tasks.prepare.runtimes.ort_training.artifacts.generate`, through ``onnxruntime.training``); the board trains
  with ``onnxruntime.training.api``.
* ``autograd``: the eval-mode export and the train step from PyTorch's autograd as a plain ONNX
  graph (:mod:`tasks.prepare.runtimes.autograd`), no ``onnxruntime.training`` anywhere; the board
  runs it with ``onnxruntime.InferenceSession`` and steps the optimizer in numpy
  (``device_agent.runtimes.autograd``).

Each runtime gives an ``export(recipe, out_dir) -> model.onnx`` and a ``generate(recipe, model.onnx,
out_dir) -> manifest``; :func:`runtime_of` picks the recipe's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.prepare.export import torchscript as export
from tasks.prepare.runtimes.autograd.build import export_model as autograd_export
from tasks.prepare.runtimes.autograd.build import generate as autograd_generate
from tasks.prepare.runtimes.ort_training import artifacts
from tasks.prepare.sandbox.supervise import supervised
from tasks.recipe.schema import Recipe


@dataclass(frozen=True)
class Runtime:
    """How one runtime prepares a recipe: the model's export and the training artifacts."""

    name: str
    export: Callable[[Recipe, Path], Path]
    generate: Callable[[Recipe, Path, Path], dict[str, Any]]


RUNTIMES = {
    "ort-training": Runtime("ort-training", export.export_model, artifacts.generate),
    "autograd": Runtime("autograd", autograd_export, autograd_generate),
}


def runtime_of(recipe: Recipe) -> Runtime:
    """The runtime the recipe's ``training.runtime`` names."""
    return RUNTIMES[recipe.training.runtime]


def export_model(recipe: Recipe, out_dir: Path) -> Path:
    """``out_dir/model.onnx`` as the recipe's runtime exports it."""
    return runtime_of(recipe).export(recipe, out_dir)


def generate(recipe: Recipe, model_onnx: Path, out_dir: Path) -> dict[str, Any]:
    """The recipe's runtime's training artifacts and ``manifest.json``; the manifest. Its graph runs
    are the supervised ``artifacts`` stage's, fed the recipe's own data (``odl prepare`` and ``odl
    artifacts`` alike)."""
    with supervised("artifacts", recipe):
        return runtime_of(recipe).generate(recipe, model_onnx, out_dir)
