"""Build the recipe's PyTorch model on the host: torchvision by name or a ``module:callable``.

``module:callable`` references resolve first against ``module.py`` in the recipe's folder, then
against the import path, so recipes and their model files can be copied together anywhere.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.errors import ModelError, RecipeError
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)


def load_ref(base_dir: Path, ref: str, field: str = "model.callable") -> Callable[..., Any]:
    """Return the callable named by ``module:callable``, importing ``base_dir/module.py`` if it exists."""
    module_name, _, attr = ref.partition(":")
    local = Path(base_dir) / (module_name.replace(".", "/") + ".py")
    try:
        module = _load_file(local) if local.is_file() else importlib.import_module(module_name)
    except ImportError as exc:
        raise RecipeError(
            field, f"an importable module '{module_name}' (next to the recipe or installed)", str(exc)
        ) from exc
    func = getattr(module, attr, None)
    if not callable(func):
        raise RecipeError(field, f"a callable named '{attr}' in module '{module_name}'", ref)
    return func


def _load_file(path: Path) -> Any:
    """Import a module from a file under a name unique to its path (cached in sys.modules)."""
    name = f"_odl_recipe_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _torchvision_model(name: str, num_classes: int, kwargs: dict[str, Any]) -> Any:
    """Build a torchvision classification model with random init and a new ``num_classes`` head."""
    from torchvision import models

    try:
        builder = models.get_model_builder(name)
    except ValueError as exc:
        raise RecipeError("model.torchvision", "a torchvision classification model name", name) from exc
    try:
        return builder(weights=None, num_classes=num_classes, **kwargs)
    except TypeError as exc:
        raise RecipeError(
            "model.kwargs", f"arguments accepted by torchvision.models.{name}", str(exc)
        ) from exc


def _callable_model(recipe: Recipe) -> Any:
    import torch

    func = load_ref(recipe.base_dir, recipe.model.ref)
    kwargs = dict(recipe.model.kwargs)
    if recipe.model.num_classes is not None:
        kwargs.setdefault("num_classes", recipe.model.num_classes)
    try:
        model = func(**kwargs)
    except TypeError as exc:
        raise RecipeError("model.kwargs", f"arguments accepted by {recipe.model.ref}", str(exc)) from exc
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"{recipe.model.ref} returned {type(model).__name__}, expected a torch.nn.Module")
    return model


def load_weights(model: Any, path: Path, *, replaced_head: bool = False) -> None:
    """Load a local state_dict file into ``model``; every key must match, except a replaced head.

    With ``replaced_head`` (torchvision models with a new ``num_classes``), up to two tensors whose
    shape differs (the classifier's weight and bias, e.g. ImageNet's 1000 classes) keep their init.
    """
    import torch

    if not path.is_file():
        raise RecipeError("model.weights", "an existing state_dict file", str(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
        own = model.state_dict()
        skipped = [k for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
        if replaced_head and len(skipped) <= 2:
            state = {**state, **{k: own[k] for k in skipped}}
            if skipped:
                log.info("weights %s: kept the new classifier head for %s", path.name, skipped)
        model.load_state_dict(state, strict=True)
    except (RuntimeError, ValueError, OSError, EOFError, KeyError) as exc:
        raise ModelError(f"cannot load weights {path} into the model: {str(exc).splitlines()[0]}") from exc


def build_model(recipe: Recipe) -> Any:
    """Build the recipe's ``torch.nn.Module`` in eval mode with its weights loaded."""
    spec = recipe.model
    if spec.kind == "onnx":
        raise ModelError("model.onnx recipes have no PyTorch model (they start from an ONNX file)")
    if spec.kind == "torchvision":
        model = _torchvision_model(spec.ref, spec.num_classes or 0, dict(spec.kwargs))
    else:
        model = _callable_model(recipe)
    if spec.weights is not None:
        load_weights(model, spec.weights, replaced_head=spec.kind == "torchvision")
    log.debug("built %s model %s", spec.kind, spec.ref)
    return model.eval()
