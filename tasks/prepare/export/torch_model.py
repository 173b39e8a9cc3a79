"""Build the recipe's PyTorch model on the host: torchvision by name or a ``module:callable``.

``module:callable`` references resolve first against ``module.py`` in the recipe's folder, then
against the import path, so recipes and their model files can be copied together anywhere.

While a recipe's module loads and while its callables run (model, ``[data].make``, custom loss),
the recipe's folder is first on ``sys.path`` (:func:`recipe_import_path`), so ``mymodel.py`` may
import a sibling package (``from vision.ssd import Net`` with ``vision/`` beside the recipe).
Siblings stay cached in ``sys.modules`` for later calls from the same folder; a recipe from another
folder first drops them, so its own ``vision`` package is imported, not the first recipe's. A
sibling named like a module imported outside any recipe (``torch``, ``tasks``) is that module:
give siblings distinct names.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import copy
import functools
import hashlib
import importlib
import importlib.util
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tasks.errors import ModelError, RecipeError
from tasks.prepare.export.bn_calibration import calibrated
from tasks.prepare.export.user_code import user_code_error
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)

_PATH_LOCK = threading.RLock()  # sys.path and sys.modules are process-wide
_SIBLINGS: dict[str, Path] = {}  # top-level module name -> the recipe folder it was imported from
_FILE_PREFIX = "_odl_recipe_"  # sys.modules names of recipe files loaded by path (unique per path)
# within one preparation (:func:`one_build`): the state of each recipe's model as first built
_BUILT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "odl_built_models", default=None
)


@contextlib.contextmanager
def recipe_import_path(base_dir: Path) -> Iterator[None]:
    """Put ``base_dir`` first on ``sys.path`` for the block; restore ``sys.path`` exactly afterwards.

    Siblings cached from another recipe folder are dropped on entry; the top-level modules the
    block imports from ``base_dir`` are remembered as this folder's siblings on exit.
    """
    base = Path(base_dir).resolve()
    with _PATH_LOCK:
        _drop_siblings(keep=base)
        saved_path, before = list(sys.path), set(sys.modules)
        sys.path.insert(0, str(base))
        try:
            yield
        finally:
            sys.path[:] = saved_path
            if base not in {Path(p or ".").resolve() for p in saved_path}:  # else not the recipe's own
                _remember_siblings(base, before)


def _drop_siblings(keep: Path) -> None:
    """Forget the modules (and submodules) imported from recipe folders other than ``keep``."""
    for top in [t for t, folder in _SIBLINGS.items() if folder != keep]:
        del _SIBLINGS[top]
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[name]


def _remember_siblings(base: Path, before: set[str]) -> None:
    """Record the new top-level modules imported from a file or package in ``base`` (not :func:`_load_file`'s)."""
    for top in {n.partition(".")[0] for n in list(sys.modules) if n not in before} - before:
        if top.startswith(_FILE_PREFIX):
            continue
        module = sys.modules.get(top)
        places = [getattr(module, "__file__", None), *(getattr(module, "__path__", None) or ())]
        if any(p and Path(p).resolve().parent == base for p in places):
            _SIBLINGS[top] = base


def load_ref(base_dir: Path, ref: str, field: str = "model.callable") -> Callable[..., Any]:
    """Return the callable named by ``module:callable``, importing ``base_dir/module.py`` if it exists.

    The module is imported, and the returned callable runs, under :func:`recipe_import_path`.
    """
    module_name, _, attr = ref.partition(":")
    local = Path(base_dir) / (module_name.replace(".", "/") + ".py")
    try:
        with recipe_import_path(base_dir):
            module = _load_file(local) if local.is_file() else importlib.import_module(module_name)
    except ImportError as exc:
        raise RecipeError(
            field, f"an importable module '{module_name}' (next to the recipe or installed)", str(exc)
        ) from exc
    func = getattr(module, attr, None)
    if not callable(func):
        raise RecipeError(field, f"a callable named '{attr}' in module '{module_name}'", ref)
    return _on_recipe_path(base_dir, func)


def _on_recipe_path(base_dir: Path, func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``func`` so each call runs under :func:`recipe_import_path` (its lazy imports find siblings)."""

    @functools.wraps(func, updated=())
    def call(*args: Any, **kwargs: Any) -> Any:
        with recipe_import_path(base_dir):
            return func(*args, **kwargs)

    return call


def _load_file(path: Path) -> Any:
    """Import a module from a file under a name unique to its path (cached in sys.modules)."""
    name = f"{_FILE_PREFIX}{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]}_{path.stem}"
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
    """Build a torchvision classification or segmentation model with random init (no backbone
    weights are downloaded either) and a new ``num_classes`` head."""
    import inspect

    from torchvision import models  # torchvision (heavy) only for its models

    try:
        builder = models.get_model_builder(name)
    except ValueError as exc:
        raise RecipeError("model.torchvision", "a torchvision classification model name", name) from exc
    try:
        if "weights_backbone" in inspect.signature(builder).parameters:  # segmentation heads
            kwargs.setdefault("weights_backbone", None)
        return builder(weights=None, num_classes=num_classes, **kwargs)
    except TypeError as exc:
        raise RecipeError(
            "model.kwargs", f"arguments accepted by torchvision.models.{name}", str(exc)
        ) from exc


def _callable_model(recipe: Recipe) -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    func = load_ref(recipe.base_dir, recipe.model.ref)
    kwargs = builder_kwargs(func, recipe.model.kwargs, recipe.model.num_classes)
    try:
        model = func(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        if "num_classes" not in recipe.model.kwargs and _sets_its_own(exc, "num_classes"):
            raise RecipeError(
                "model.num_classes",
                f"a builder that takes num_classes: {recipe.model.ref} receives num_classes="
                f"{recipe.model.num_classes} from model.num_classes through its **kwargs and passes its own "
                "as well; give it a num_classes parameter (model.num_classes is passed there) or no **kwargs",
                str(exc).splitlines()[0],
            ) from exc
        named = user_code_error(exc, recipe.base_dir, "building the model")
        if named is not None:
            raise named from exc
        if isinstance(exc, TypeError):  # the call itself: the arguments do not fit
            raise RecipeError("model.kwargs", f"arguments accepted by {recipe.model.ref}", str(exc)) from exc
        raise
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"{recipe.model.ref} returned {type(model).__name__}, expected a torch.nn.Module")
    return model


def builder_kwargs(func: Any, kwargs: dict[str, Any], num_classes: int | None) -> dict[str, Any]:
    """The keyword arguments of a ``module:callable`` builder: ``model.kwargs``, and ``num_classes``
    (``model.num_classes``) when the builder accepts it: a parameter of that name or ``**kwargs``."""
    out = dict(kwargs)
    if num_classes is None or "num_classes" in out:
        return out
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): pass it, as documented
        return {**out, "num_classes": num_classes}
    named = any(
        p.name == "num_classes" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params
    )
    if named or any(p.kind == p.VAR_KEYWORD for p in params):
        out["num_classes"] = num_classes
    return out


def _sets_its_own(exc: BaseException, name: str) -> bool:
    """``exc`` is Python's "got multiple values for keyword argument '<name>'"."""
    return isinstance(exc, TypeError) and f"multiple values for keyword argument '{name}'" in str(exc)


def load_weights(model: Any, path: Path, *, replaced_head: bool = False) -> None:
    """Load a local state_dict file into ``model``; every key must match, except a replaced head.

    With ``replaced_head`` (torchvision models with a new ``num_classes``), up to two tensors whose
    shape differs (the classifier's weight and bias, e.g. ImageNet's 1000 classes) keep their init.
    """
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if not path.is_file():
        raise RecipeError("model.weights", "an existing state_dict file", str(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
        own = model.state_dict()
        skipped = [k for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
        meta = getattr(state, "_metadata", None) or getattr(own, "_metadata", None)
        state = collections.OrderedDict(state)
        if replaced_head and len(skipped) <= 2:
            state.update({k: own[k] for k in skipped})
            if skipped:
                log.info("weights %s: kept the new classifier head for %s", path.name, skipped)
        # a file saved without module versions (weights_only loading drops them) is read as the
        # model's own version: MNASNet's loader refuses a state dict without one
        state._metadata = meta  # type: ignore[attr-defined]
        model.load_state_dict(state, strict=True)
    except (RuntimeError, ValueError, OSError, EOFError, KeyError) as exc:
        raise ModelError(f"cannot load weights {path} into the model: {str(exc).splitlines()[0]}") from exc


@contextlib.contextmanager
def one_build() -> Iterator[None]:
    """Within the block (one preparation), :func:`build_model` constructs each recipe's module, loads
    its weights and measures its BatchNorm statistics once; a later build gives back that module
    with the state and ``requires_grad`` flags it was first built with (mobilenet_v2's build with
    64 calibration images: 2-3 s; an smp FPN's construction 3-5 s; three builds a preparation)."""
    token = _BUILT.set({})
    try:
        yield
    finally:
        _BUILT.reset(token)


def build_model(recipe: Recipe) -> Any:
    """Build the recipe's ``torch.nn.Module`` in eval mode with its weights loaded (and its BatchNorm
    statistics measured on the recipe's data when ``trainable.batchnorm_calibration`` asks)."""
    spec = recipe.model
    if spec.kind == "onnx":
        raise ModelError("model.onnx recipes have no PyTorch model (they start from an ONNX file)")
    built, key = _BUILT.get(), _build_key(recipe)
    if built is not None and key in built:  # the module first built, given back as it was built
        model, flags = built[f"{key}:module"]
        model.load_state_dict(copy.deepcopy(built[key]))  # its _metadata too (MNASNet reads it)
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)
        return model.eval()
    if spec.kind == "torchvision":
        model = _torchvision_model(spec.ref, spec.num_classes or 0, dict(spec.kwargs))
    else:
        model = _callable_model(recipe)
    if spec.weights is not None:
        load_weights(model, spec.weights, replaced_head=spec.kind == "torchvision")
    calibrated(recipe, model)  # trainable.batchnorm_calibration: statistics of the recipe's data
    if built is not None:
        built[key] = copy.deepcopy(model.state_dict())
        built[f"{key}:module"] = (model, [p.requires_grad for p in model.parameters()])
    log.debug("built %s model %s", spec.kind, spec.ref)
    return model.eval()


def _build_key(recipe: Recipe) -> str:
    """What a build depends on: the model table, the calibration and the recipe's folder."""
    parts = (recipe.base_dir, recipe.model, recipe.trainable.batchnorm_calibration, recipe.data.train)
    return repr(parts)
