"""Export the recipe's PyTorch model to ONNX in training mode (the input of ``generate_artifacts``).

Per FACTS.md: the TorchScript exporter (``dynamo=False``) with ``training=TRAINING``,
``do_constant_folding=False``, ``export_params=True``, opset 17 and a dynamic batch axis, on a copy
of the model (tracing in training mode would update BatchNorm running statistics). The exporter's
deprecation warnings and C++ chatter are captured and logged at DEBUG level.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import ModelError, RecipeError
from tasks.recipe.datafiles import load_arrays
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
OPSET = 17
EXAMPLE_BATCH = 2


@contextlib.contextmanager
def quiet_stderr(what: str) -> Iterator[None]:
    """Capture Python warnings and everything written to fd 2; log it at DEBUG afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace").strip()
            msgs = [f"{w.category.__name__}: {w.message}" for w in caught]
            log.debug("%s: %d warnings, %d bytes of stderr captured", what, len(msgs), len(text))
            for line in [*dict.fromkeys(msgs), *text.splitlines()[-40:]]:
                log.debug("%s: %s", what, line)


def feed_keys(recipe: Recipe, input_names: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Map graph input names to npz keys: ``[data].feeds`` first, then ``x``, ``y`` by position."""
    defaults = dict(zip(input_names, ("x", "y"), strict=False))
    return {name: recipe.data.feeds.get(name, defaults.get(name, name)) for name in input_names}


def example_arrays(recipe: Recipe, input_names: tuple[str, ...], n: int = EXAMPLE_BATCH) -> list[np.ndarray]:
    """The first ``n`` samples of the recipe's data for each input (random x if no data file exists)."""
    path = recipe.data.train if recipe.data.train and recipe.data.train.exists() else recipe.data.test
    if not path.exists():
        if len(input_names) > 1:
            raise ModelError(f"a model with inputs {list(input_names)} needs its data file {path} to export")
        return [np.random.default_rng(0).standard_normal((n, *recipe.model.input_shape), dtype=np.float32)]
    arrays = load_arrays(path)
    out = []
    for name, key in feed_keys(recipe, input_names).items():
        if key not in arrays:
            raise RecipeError(f"data.feeds.{name}", f"an array of {path.name} (has {sorted(arrays)})", key)
        out.append(arrays[key][:n])
    if tuple(out[0].shape[1:]) != tuple(recipe.model.input_shape):
        raise RecipeError(
            "model.input_shape",
            f"the shape of one sample of '{input_names[0]}' in {path.name}, {list(out[0].shape[1:])}",
            list(recipe.model.input_shape),
        )
    return out


def _dynamic_axes(names: tuple[str, ...], arrays: list[Any], batch: int) -> dict[str, dict[int, str]]:
    return {
        n: {0: "batch"} for n, a in zip(names, arrays, strict=True) if a.ndim >= 1 and a.shape[0] == batch
    }


def _outputs_of(model: Any, inputs: tuple[Any, ...], recipe: Recipe) -> list[Any]:
    import torch

    with torch.no_grad():
        out = model(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(outs) != len(recipe.model.output_names):
        raise RecipeError(
            "model.output_names",
            f"{len(outs)} names (the model returns {len(outs)} outputs)",
            list(recipe.model.output_names),
        )
    return outs


def export_torch(recipe: Recipe, model: Any, path: Path) -> Path:
    """Export ``model`` (left untouched) to ``path`` in training mode with a dynamic batch axis."""
    import torch

    names_in, names_out = recipe.model.input_names, recipe.model.output_names
    inputs = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in example_arrays(recipe, names_in))
    work = copy.deepcopy(model).eval()
    for m in work.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.momentum = 0.0  # tracing in training mode must not move the running statistics
    try:
        outs = _outputs_of(work, inputs, recipe)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise RecipeError(
            "model.input_shape",
            "a shape the model accepts",
            f"{list(recipe.model.input_shape)}: {str(exc).splitlines()[0]}",
        ) from exc
    axes = {
        **_dynamic_axes(names_in, list(inputs), len(inputs[0])),
        **_dynamic_axes(names_out, outs, len(inputs[0])),
    }
    with quiet_stderr("torch.onnx.export"):
        try:
            torch.onnx.export(
                work,
                inputs,
                str(path),
                dynamo=False,
                training=torch.onnx.TrainingMode.TRAINING,
                do_constant_folding=False,
                export_params=True,
                opset_version=OPSET,
                input_names=list(names_in),
                output_names=list(names_out),
                dynamic_axes=axes,
            )
        except Exception as exc:  # the exporter raises many types; all mean "cannot export"
            raise ModelError(f"cannot export {recipe.model.ref} to ONNX: {str(exc).splitlines()[0]}") from exc
    return path


def load_onnx(path: Path) -> Any:
    """Read an ONNX file; RecipeError if missing, ModelError if truncated or not ONNX."""
    import onnx

    if not path.is_file():
        raise RecipeError("model.onnx", "an existing ONNX file", str(path))
    try:
        return onnx.load(str(path))
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelError(f"{path} is not a valid ONNX model (truncated or corrupt?): {exc}") from exc


def check_onnx(path: Path, model: Any = None) -> Any:
    """Load (unless given) and run the ONNX checker; ModelError if the model is invalid."""
    import onnx

    model = load_onnx(path) if model is None else model
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # ValidationError, ...
        raise ModelError(f"{path} is not a valid ONNX model (truncated or corrupt?): {exc}") from exc
    return model


def export_model(recipe: Recipe, out_dir: Path) -> Path:
    """Write ``out_dir/model.onnx``: a training-mode export, or a checked copy for ``model.onnx`` recipes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "model.onnx"
    if recipe.model.kind == "onnx":
        check_onnx(Path(recipe.model.ref))
        shutil.copyfile(recipe.model.ref, target)
        return target
    from tasks.prepare.torch_model import build_model

    export_torch(recipe, build_model(recipe), target)
    check_onnx(target)
    log.info("exported %s to %s (%.1f KB)", recipe.model.ref, target, target.stat().st_size / 1024)
    return target
