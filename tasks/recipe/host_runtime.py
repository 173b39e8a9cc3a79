"""Which training runtimes this host's Python can prepare.

``training.runtime = "ort-training"`` builds its graphs with onnxruntime-training, whose last release
(1.19.2) has wheels for CPython <= 3.11 only; on Python 3.12 and 3.13 the project installs plain
onnxruntime in its place (``constraints.txt``) and only ``"autograd"`` prepares. :func:`check_runtime`
refuses the other in one line when the recipe is loaded, before anything runs.
"""

from __future__ import annotations

import sys
from importlib import metadata

from tasks.errors import RecipeError

# the distributions that ship onnxruntime.training (the full wheel and the CPU-only one)
TRAINING_DISTRIBUTIONS = ("onnxruntime-training", "onnxruntime-training-cpu")
LAST_PYTHON = (3, 11)  # the newest CPython onnxruntime-training 1.19.2 has wheels for


def ort_training_installed(distributions: tuple[str, ...] = TRAINING_DISTRIBUTIONS) -> bool:
    """Whether one of ``distributions`` is installed in this Python (read from its metadata: no import)."""
    for name in distributions:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return True
    return False


def why_no_ort_training(
    version: tuple[int, ...] = tuple(sys.version_info[:2]), installed: bool | None = None
) -> str | None:
    """Why this host cannot prepare ``ort-training`` recipes, or None when it can."""
    if ort_training_installed() if installed is None else installed:
        return None
    python = ".".join(str(part) for part in version[:2])
    if tuple(version[:2]) > LAST_PYTHON:
        return (
            f"onnxruntime-training has no wheel for Python {python} (its last release, 1.19.2, stops at 3.11)"
        )
    return f"onnxruntime-training is not installed in this Python {python} (make install puts it in .venv)"


def check_runtime(recipe: object, source: str = "", why: str | None = None) -> None:
    """RecipeError naming ``training.runtime`` when the recipe asks for ``ort-training`` and this host
    cannot build it (``why``: :func:`why_no_ort_training`'s answer, computed when not given)."""
    if recipe.training.runtime != "ort-training":  # type: ignore[attr-defined]
        return
    why = why if why is not None else why_no_ort_training()
    if why is None:
        return
    raise RecipeError("training.runtime", f"'autograd' on this host: {why}", "ort-training", source=source)
