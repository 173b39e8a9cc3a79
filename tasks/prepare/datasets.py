"""A recipe's data files on the host, generated when missing: ``[data].make`` names a callable
(``module:function``, resolved like a model's) that writes them into the folder of the train (else
test) file; it runs once, under a file lock, even when several runs prepare at the same time."""

from __future__ import annotations

import fcntl
import logging
from pathlib import Path

from tasks.errors import DataError, RecipeError
from tasks.prepare.torch_model import load_ref
from tasks.recipe.datafiles import recipe_files
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)


def make_dir(recipe: Recipe) -> Path:
    """The folder a ``[data].make`` callable writes into: the folder of the train (else test) file."""
    return (recipe.data.train or recipe.data.test).parent


def ensure_datasets(recipe: Recipe) -> None:
    """Run ``[data].make`` (once, under a file lock) when a file the recipe needs is missing."""
    missing = {k: p for k, p in recipe_files(recipe).items() if not p.exists()}
    if not missing:
        return
    if recipe.data.make is None:
        field, path = next(iter(missing.items()))
        raise DataError(f"recipe field '{field}': file {path} does not exist and [data].make is not set")
    out_dir = make_dir(recipe)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".make.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if any(not p.exists() for p in missing.values()):
            log.info("generating data with %s into %s", recipe.data.make, out_dir)
            load_ref(recipe.base_dir, recipe.data.make, "data.make")(out_dir)
    still = {k: str(p) for k, p in missing.items() if not p.exists()}
    if "model.onnx" in still:
        raise RecipeError(
            "model.onnx", "an existing ONNX file (or one [data].make writes)", still["model.onnx"]
        )
    if still:
        raise DataError(f"[data].make {recipe.data.make} did not write {still}")
