"""Export the recipe's PyTorch model to ONNX in training mode (the input of ``generate_artifacts``).

Per FACTS.md: the TorchScript exporter (``dynamo=False``) with ``training=TRAINING``,
``do_constant_folding=False``, ``export_params=True``, opset 17 and a dynamic batch axis. It traces
the caller's model itself, not a deep copy (a module holding a lock, a file or a module object
cannot be copied, nor can torchvision's MNASNet): every parameter and buffer value (BatchNorm running
statistics included), each module's ``training`` flag and BatchNorm momentum are restored afterwards,
also when the export fails. The exporter's warnings, C++ chatter and the TorchScript graph it prints
on stdout when it fails are captured and logged at DEBUG level; a failure becomes one ModelError
line naming the operator, the module that uses it and what to change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tasks.errors import ModelError, RecipeError
from tasks.prepare.export.buffers import record_torch_state
from tasks.prepare.export.onnx_in import adapt_onnx
from tasks.prepare.export.priors import PRIORS_FILE, write_priors
from tasks.prepare.export.torch_model import build_model
from tasks.prepare.export.tracing import (
    bags_as_embeddings,
    channel_dropout_modules,
    has_auxiliary_outputs,
    model_outputs,
    projected_lstms_unrolled,
    restored,
)
from tasks.prepare.export.user_code import forward_error, user_code_error
from tasks.prepare.feeds import data_file, example_arrays
from tasks.prepare.messages import export_failure, layer_of
from tasks.prepare.onnx_versions import OPSET
from tasks.prepare.prefix import RANDOM_OPS
from tasks.prepare.rewrites.recurrent import recurrent_dropout_modules
from tasks.prepare.sandbox.supervise import supervised
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Captured:
    """What a :func:`quiet_output` block wrote to its file descriptors (filled when the block ends)."""

    text: str = ""


@contextlib.contextmanager
def quiet_output(what: str, fds: tuple[int, ...] = (1, 2)) -> Iterator[Captured]:
    """Capture Python warnings and everything written to ``fds``; log it at DEBUG afterwards."""
    streams = [s for s in (sys.stdout, sys.stderr) if s is not None]
    for stream in streams:
        stream.flush()
    saved = {fd: os.dup(fd) for fd in fds}
    captured = Captured()
    names = [name for fd, name in ((1, "stdout"), (2, "stderr")) if fd in fds]
    with tempfile.TemporaryFile(mode="w+b") as tmp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fd in fds:
            os.dup2(tmp.fileno(), fd)
        # Python's own sys.stdout/sys.stderr too: one a host replaced (a test's capture, a worker's
        # logging) does not write to the file descriptor (torch.export prints its graph on sys.stderr)
        python_side = open(tmp.fileno(), "w", closefd=False, buffering=1)  # noqa: SIM115 - closed below
        kept_streams = {name: getattr(sys, name) for name in names}
        for name in names:
            setattr(sys, name, python_side)
        try:
            yield captured
        finally:
            for name, stream in kept_streams.items():
                setattr(sys, name, stream)
            python_side.close()
            for stream in streams:
                stream.flush()
            for fd, kept in saved.items():
                os.dup2(kept, fd)
                os.close(kept)
            tmp.seek(0)
            captured.text = tmp.read().decode(errors="replace").strip()
            _log_captured(what, [f"{w.category.__name__}: {w.message}" for w in caught], captured.text)


def quiet_stderr(what: str) -> contextlib.AbstractContextManager[Captured]:
    """:func:`quiet_output` of fd 2 only."""
    return quiet_output(what, (2,))


def _log_captured(what: str, msgs: list[str], text: str) -> None:
    log.debug("%s: %d warnings, %d bytes of output captured", what, len(msgs), len(text))
    for line in [*dict.fromkeys(msgs), *text.splitlines()[-40:]]:
        log.debug("%s: %s", what, line)


def _dynamic_axes(names: tuple[str, ...], arrays: list[Any], batch: int) -> dict[str, dict[int, str]]:
    return {
        n: {0: "batch"} for n, a in zip(names, arrays, strict=True) if a.ndim >= 1 and a.shape[0] == batch
    }


def _outputs_of(model: Any, inputs: tuple[Any, ...], recipe: Recipe) -> list[Any]:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    with torch.no_grad():
        out = model(*inputs)
    outs = model_outputs(out)
    if len(outs) != len(recipe.model.output_names):
        raise RecipeError(
            "model.output_names",
            f"{len(outs)} names (the model returns {len(outs)} outputs)",
            list(recipe.model.output_names),
        )
    return outs


def export_torch(recipe: Recipe, model: Any, path: Path) -> Path:
    """Export ``model`` (left as it was) to ``path`` in training mode with a dynamic batch axis."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    inputs = tuple(
        torch.from_numpy(np.ascontiguousarray(a)) for a in example_arrays(recipe, recipe.model.input_names)
    )
    with restored(model):
        model.eval()
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.momentum = 0.0  # tracing in training mode must not move the running statistics
        axes = _batch_axes(recipe, model, inputs)
        aux = has_auxiliary_outputs(model, inputs, len(recipe.model.output_names))
        if aux:
            # train the main output only: the root stays in eval mode (no auxiliary heads), every
            # layer below it traces in training mode as with TrainingMode.TRAINING
            log.info(
                "%s returns auxiliary outputs in training mode: exporting its main output only",
                recipe.model.ref,
            )
            for m in model.modules():
                m.training = m is not model
        else:
            for m in model.modules():
                m.training = True
        channel = channel_dropout_modules(model)  # the exporter has no channel dropout in training mode
        for name, m in channel:
            m.training = False
            log.info("%s: no %s while fine-tuning (exported in eval mode)", name, type(m).__name__)
        recurrent = recurrent_dropout_modules(model)  # the exporter has no dropout inside an RNN node
        for name, m in recurrent:
            m.training = False
            log.info(
                "%s: no dropout between its stacked layers while fine-tuning (exported in eval mode)", name
            )
        _run_exporter(recipe, model, inputs, axes, path, preserve=aux or bool(recurrent) or bool(channel))
        # a random layer drop (torchvision's StochasticDepth, timm's DropPath, a hand-written mask)
        # traces as RandomUniformLike & co., which ORT's eval graph and the exported inference model
        # keep: the board's model would answer at random. The modules those nodes come from trace
        # again in eval mode (no random drop while fine-tuning); Dropout, which ORT handles, stays.
        random_layers = _random_modules(model, path)
        if random_layers:
            for m in random_layers:
                m.training = False
            log.info(
                "%d layers with random ops exported in eval mode (no random layer drop)", len(random_layers)
            )
            _run_exporter(recipe, model, inputs, axes, path, preserve=True)
    record_torch_state(model, path)
    return path


def _random_modules(model: Any, path: Path) -> list[Any]:
    """The submodules whose exported nodes draw random numbers (found by the nodes' scope names);
    [] when there are none or one comes from the model's own forward (validation names those)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    names = {layer_of(n.name) for n in graph.node if n.op_type in RANDOM_OPS and n.name}
    modules = dict(model.named_modules())
    # a module called twice in one forward names its second call's nodes "<module>_1" (SegFormer's drop_path)
    found = [modules.get(name, modules.get(re.sub(r"_\d+$", "", name))) for name in sorted(names)]
    return [] if not found or any(m is None or m is model for m in found) else found


def _batch_axes(recipe: Recipe, model: Any, inputs: tuple[Any, ...]) -> dict[str, dict[int, str]]:
    """Dynamic batch axes of inputs and outputs, from one forward pass (RecipeError on a wrong shape)."""
    try:
        outs = _outputs_of(model, inputs, recipe)
    except (RuntimeError, ValueError, TypeError) as exc:
        source, path = data_file(recipe)
        fed = f"{len(inputs[0])} samples of {source}" if path.exists() else f"{len(inputs[0])} random samples"
        raise forward_error(exc, recipe.base_dir, fed, list(recipe.model.input_shape)) from exc
    batch = len(inputs[0])
    return {
        **_dynamic_axes(recipe.model.input_names, list(inputs), batch),
        **_dynamic_axes(recipe.model.output_names, outs, batch),
    }


def _run_exporter(
    recipe: Recipe,
    model: Any,
    inputs: tuple[Any, ...],
    axes: dict[str, dict[int, str]],
    path: Path,
    *,
    preserve: bool = False,
) -> None:
    """Run the TorchScript exporter with stdout and stderr captured; ModelError (one line) if it fails.

    ``preserve`` keeps each module's training flag as set (else every module traces in training mode).
    """
    import torch  # torch (heavy) only when a PyTorch model is built or run

    failure: Exception | None = None
    with quiet_output("torch.onnx.export") as out, bags_as_embeddings(), projected_lstms_unrolled(model):
        try:
            torch.onnx.export(
                model,
                inputs,
                str(path),
                dynamo=False,
                training=torch.onnx.TrainingMode.PRESERVE if preserve else torch.onnx.TrainingMode.TRAINING,
                do_constant_folding=False,
                export_params=True,
                opset_version=OPSET,
                input_names=list(recipe.model.input_names),
                output_names=list(recipe.model.output_names),
                dynamic_axes=axes,
            )
        except Exception as exc:  # the exporter raises many types; all mean "cannot export"
            failure = exc
    if failure is not None:
        named = user_code_error(failure, recipe.base_dir, "while the exporter traced it")
        raise (named or ModelError(export_failure(recipe, failure, out.text))) from failure


def load_onnx(path: Path) -> Any:
    """Read an ONNX file; RecipeError if missing, ModelError if truncated or not ONNX."""

    if not path.is_file():
        raise RecipeError("model.onnx", "an existing ONNX file", str(path))
    try:
        return onnx.load(str(path))
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelError(f"{path} is not a valid ONNX model (truncated or corrupt?): {exc}") from exc


def check_onnx(path: Path, model: Any = None) -> Any:
    """Load (unless given) and run the ONNX checker; ModelError if the model is invalid."""

    model = load_onnx(path) if model is None else model
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # ValidationError, ...
        raise ModelError(f"{path} is not a valid ONNX model (truncated or corrupt?): {exc}") from exc
    return model


def export_model(recipe: Recipe, out_dir: Path) -> Path:
    """Write ``out_dir/model.onnx``: a training-mode export, or a checked copy for ``model.onnx`` recipes.
    Its graph runs take the recipe's data and are supervised (stage ``export``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "model.onnx"
    with supervised("export", recipe):
        if recipe.model.kind == "onnx":  # loaded, converted, cut and given its head (onnx_in)
            adapt_onnx(recipe, target)
            write_priors(recipe, None, target, out_dir / PRIORS_FILE)
            return target
        module = build_model(recipe)
        export_torch(recipe, module, target)
        check_onnx(target)
        write_priors(recipe, module, target, out_dir / PRIORS_FILE)
    log.info("exported %s to %s (%.1f KB)", recipe.model.ref, target, target.stat().st_size / 1024)
    return target
