"""The autograd runtime's preparation: ``model.onnx`` (the model in eval mode) and the artifacts.

:func:`export_model` writes the TorchScript export of the model in eval mode (no training-mode
export: nothing here traces a training graph through TorchScript), whose initializers carry
PyTorch's parameter names; an ONNX model (``[model] onnx``) is adapted as the ORT path adapts it
(:func:`tasks.prepare.export.onnx_in.adapt_onnx`). :func:`generate` resolves the trainable set on it
exactly as the ORT path does (:func:`tasks.prepare.trainable.resolve_trainable`), maps each name to
the PyTorch parameter of that name (one line for one without), or for an ONNX model to the tensors of
its PyTorch twin that hold that initializer (:mod:`.from_onnx`), and writes into ``artifacts/``:

* ``train_step.onnx``, ``eval_step.onnx`` (:mod:`.steps`);
* ``inference_template.onnx`` (:mod:`.template`);
* ``checkpoint.npz``, the trainable tensors' initial values;
* ``step.json``, what the board's runtime (``device_agent.runtimes.autograd``) reads: feeds,
  trainable tensors, noise inputs, outputs, gradients, the optimizer as the recipe says, and what
  each file leaves out of the weights other files hold, each uploaded once (:mod:`.shared`);

and ``manifest.json`` with the ORT path's keys (``runtime`` = ``autograd``); the frozen-prefix
cache's split steps are :mod:`.prefix_split`'s.
Nothing here imports ``onnxruntime.training``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
from onnx import numpy_helper

from tasks.errors import ModelError, RecipeError
from tasks.prepare.export.buffers import record_torch_state
from tasks.prepare.export.onnx_in import adapt_onnx
from tasks.prepare.export.priors import PRIORS_FILE, write_priors
from tasks.prepare.export.torch_model import build_model
from tasks.prepare.export.torchscript import check_onnx, load_onnx
from tasks.prepare.export.tracing import restored
from tasks.prepare.export.user_code import forward_error
from tasks.prepare.feeds import data_file, feed_keys
from tasks.prepare.manifest import common_manifest, trainable_layers
from tasks.prepare.messages import export_failure
from tasks.prepare.onnx_versions import check_board_loadable
from tasks.prepare.rewrites.param_chains import split_shared_initializers
from tasks.prepare.runtimes.autograd.from_onnx import graph_named, torch_twin
from tasks.prepare.runtimes.autograd.prefix_split import split_steps
from tasks.prepare.runtimes.autograd.recurrent import covered
from tasks.prepare.runtimes.autograd.shared import share
from tasks.prepare.runtimes.autograd.steps import (
    EVAL_FILE,
    TRAIN_FILE,
    build_steps,
    example_batch,
    model_inputs,
)
from tasks.prepare.runtimes.autograd.template import export_inference, write_template
from tasks.prepare.sandbox.supervise import supervised
from tasks.prepare.trainable import model_parameter_count, resolve_trainable
from tasks.recipe.load import recipe_hash
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
RUNTIME = "autograd"
FILES = {
    "train_step": f"artifacts/{TRAIN_FILE}",
    "eval_step": f"artifacts/{EVAL_FILE}",
    "step": "artifacts/step.json",
    "checkpoint": "artifacts/checkpoint.npz",
    "inference_template": "artifacts/inference_template.onnx",
}
ADAMW = {"betas": [0.9, 0.999], "eps": 1e-6}  # onnxblock.optim.AdamW's defaults, which the ORT path uses


def export_model(recipe: Recipe, out_dir: Path) -> Path:
    """Write ``out_dir/model.onnx``: the recipe's PyTorch model exported in eval mode, or its ONNX
    model adapted (converted, cut, given its head) exactly as the ORT path adapts it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "model.onnx"
    if recipe.model.kind == "onnx":
        with supervised("export", recipe):  # its graph runs take the recipe's data
            adapt_onnx(recipe, target)
            write_priors(recipe, None, target, out_dir / PRIORS_FILE)
        return target
    module = build_model(recipe)
    inputs = model_inputs(recipe, example_batch(module, [tuple(recipe.model.input_shape)]))
    forward_once(recipe, module, inputs)

    def explain(exc: BaseException, dump: str) -> Exception:  # the ORT path's line for the same failure
        return ModelError(export_failure(recipe, exc, dump))

    names = list(recipe.model.input_names), list(recipe.model.output_names)
    export_inference(module, inputs, *names, target, explain)
    record_torch_state(module, target)  # its registered buffers are not parameters
    check_onnx(target)
    write_priors(recipe, module, target, out_dir / PRIORS_FILE)
    log.info(
        "exported %s to %s in eval mode (%.1f KB)", recipe.model.ref, target, target.stat().st_size / 1024
    )
    return target


def forward_once(recipe: Recipe, model: Any, inputs: tuple[Any, ...]) -> None:
    """Run the model once in eval mode on ``inputs``: a forward that raises is one line naming the
    user's code (:func:`tasks.prepare.export.user_code.forward_error`), before any exporter runs."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    try:
        with restored(model), torch.no_grad():
            model.eval()(*inputs)
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        raise forward_error(exc, recipe.base_dir, f"{len(inputs[0])} samples of {data_file(recipe)[0]}",
                            list(recipe.model.input_shape)) from exc  # fmt: skip


def optimizer(recipe: Recipe) -> dict[str, Any]:
    """The optimizer exactly as the recipe and the ORT path's graphs have it (SGD: no weight decay,
    torch.optim.SGD's momentum when the recipe sets one; AdamW: bias correction, the decay after the
    step, as ORT's AdamW mode 1)."""
    spec = recipe.optimizer
    if spec.kind == "adamw":
        return {"kind": "adamw", "lr": spec.lr, **ADAMW, "weight_decay": spec.weight_decay}
    return {"kind": "sgd", "lr": spec.lr, "momentum": spec.momentum, "nesterov": spec.nesterov}


def torch_names(trainable: list[str], model: Any) -> None:
    """RecipeError for a trainable tensor of the export that is no parameter of the PyTorch model."""
    params = dict(model.named_parameters())
    for name in trainable:
        if name not in params:
            raise RecipeError("trainable", "parameters the PyTorch model has under the same name (training.runtime = "
                              f"'autograd' trains PyTorch's parameters; some are: {list(params)[:6]})", name)  # fmt: skip


def exported_weights(model: Any, graph: Any) -> Any:
    """``model`` holding the values its export ``graph`` holds (a model built without a weights file
    is initialised at random on each build: the steps must train the exported one)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    values = {i.name: i for i in graph.graph.initializer}
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if name in values:
                tensor.copy_(torch.from_numpy(numpy_helper.to_array(values[name]).copy()))
    return model


def rnn_dropout(model: Any) -> list[str]:
    """A warning for recurrent layers with dropout between their layers that the autograd runtime
    leaves to PyTorch's export (:func:`.recurrent.covered`: one not in float32), whose
    decomposition never applies that dropout: they train without it."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.RNNBase) and m.dropout > 0
             and m.num_layers > 1 and not covered(m)]  # fmt: skip
    if not names:
        return []
    return [f"{len(names)} recurrent layer(s) ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) drop out "
            "between their layers: PyTorch's export of a recurrent layer not in float32 leaves that dropout out, so the "
            "autograd runtime trains them without it"]  # fmt: skip


def session_settings(train_step: Path) -> dict[str, bool]:
    """The board's ONNX Runtime session settings for the steps: memory patterns (one block planned
    for all of a step's intermediates) off where a step loops over time (a ``Scan``: recurrent
    layers). Measured on the agent's train step at batch 32 (peak RSS, pattern on / off): a GRU
    over 128 steps 94 / 86 MB, an LSTM 101 / 96, a bidirectional LSTM 110 / 101; digits 78 / 78;
    mobilenet_v2 at batch 8 158 / 174 MB, the same speed."""
    import onnx  # the graph's operators

    loops = any(
        n.op_type in ("Scan", "Loop") for n in onnx.load(str(train_step), load_external_data=False).graph.node
    )
    return {"memory_pattern": not loops}


def generate(recipe: Recipe, model_onnx: Path, out_dir: Path) -> dict[str, Any]:
    """Write the autograd runtime's artifacts and ``manifest.json`` for the recipe; return the manifest."""
    out_dir, art = Path(out_dir), Path(out_dir) / "artifacts"
    graph = load_onnx(Path(model_onnx))
    check_board_loadable(graph, str(model_onnx))
    split_shared_initializers(graph)  # parameters the exporter merged are PyTorch's own again
    trainable, frozen, counts = resolve_trainable(recipe, graph, ort_limits=False)
    given, recipe = recipe, graph_named(recipe, graph)  # an ONNX model's outputs as its graph names them
    if recipe.model.kind == "onnx":  # its PyTorch twin, and the twin's tensors that hold each trainable one
        model, held = torch_twin(graph, trainable)
    else:
        model, held = exported_weights(build_model(recipe), graph), None
        torch_names(trainable, model)
    art.mkdir(parents=True, exist_ok=True)
    steps = build_steps(recipe, model, trainable, art, held, inference=graph if held is None else None)
    inference = list(
        recipe.model.output_names[1:] if recipe.loss.kind == "embedded" else recipe.model.output_names
    )
    params = {  # the graph's values, which the model's tensors hold too
        i.name: numpy_helper.to_array(i).astype(np.float32)
        for i in graph.graph.initializer
        if i.name in set(trainable)
    }
    write_template(graph, inference, trainable, out_dir / FILES["inference_template"])
    np.savez(art / "checkpoint.npz", **{n: params[n] for n in trainable})
    spec = {
        "runtime": RUNTIME,
        "feeds": steps.feeds,
        "trainable": [{"name": n, "dtype": "float32", "shape": list(params[n].shape)} for n in trainable],
        "noise": [n.to_dict() for n in steps.noise],
        "eval_noise": [n.to_dict() for n in steps.eval_noise],
        "outputs": steps.outputs,
        "gradients": steps.gradients,
        "optimizer": optimizer(recipe),
        "inference": {"outputs": inference},
        "session": session_settings(art / TRAIN_FILE),
    }
    (out_dir / FILES["step"]).write_text(json.dumps(spec, indent=2))
    manifest = _manifest(recipe, out_dir, graph, trainable, frozen, counts, steps, inference)
    manifest["recipe_hash"] = recipe_hash(given)  # the recipe as the stages load it
    manifest["prefix_cache"] = split_steps(recipe, out_dir, spec, manifest["files"], params)
    split = manifest["prefix_cache"]
    share(out_dir, [manifest["files"], *([split["files"]] if split["enabled"] else [])], trainable)
    manifest["warnings"] += rnn_dropout(model)
    for line in manifest["warnings"]:
        log.warning("%s", line)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    log.info("autograd artifacts for %s: %d trainable tensors (%d params), %d frozen, %d decomposition uses checked",
             recipe.name, len(trainable), manifest["trainable_count"], len(frozen), len(steps.checked))  # fmt: skip
    return manifest


def _manifest(recipe: Recipe, out_dir: Path, graph: Any, trainable: list[str], frozen: list[str],
              counts: dict[str, int], steps: Any, inference: list[str]) -> dict[str, Any]:  # fmt: skip
    return common_manifest(recipe, out_dir, FILES, graph, trainable, frozen, counts, steps.loss) | {
        "runtime": RUNTIME,
        "model_params": model_parameter_count(graph),
        "input_names": list(recipe.model.input_names),
        "output_names": list(recipe.model.output_names),
        "inference_output_names": inference,
        "feeds": feed_keys(recipe, [f["name"] for f in steps.feeds]),
        "batchnorm": recipe.trainable.batchnorm,
        "fixups": {},
        "trainable_layers": trainable_layers(graph, trainable, counts),
        "decompositions_checked": steps.checked,
        "eval_step_from_train_step": steps.eval_from_train,
    }
