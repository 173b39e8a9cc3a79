"""Board vs host: does the model the board trained compute what the board measured?

``board_vs_host`` trains a recipe on a board (``odl run``'s stages: :func:`tasks.stages.run.run_on_board`),
then evaluates the retrieved inference model on the host on the same eval set with the recipe's loss.
With frozen BatchNorm (``trainable.batchnorm = "frozen"``) training, the board's eval graph and the
inference model are one function, so the two losses agree to float32 rounding. ``training_graph_loss``
runs the training graph (forward only, the same trained weights; the autograd runtime's train
step) on the same set: with batch statistics it normalises differently from the model the board exports, which is the gap frozen
BatchNorm closes. ``bench/batchnorm.py`` reports both options side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from device_agent.ort import load_onnxruntime, load_training_api, seed_runtime
from device_agent.runtimes.autograd import AutogradApi
from tasks.errors import EvaluationError
from tasks.judge.evaluate import evaluate
from tasks.judge.losses import host_loss
from tasks.recipe.load import load_recipe
from tasks.stages.prepare import inputs, prepared
from tasks.stages.run import run_on_board


def relative(a: float, b: float) -> float:
    """``|a - b| / max(|b|, 1e-12)``."""
    return abs(a - b) / max(abs(b), 1e-12)


def board_vs_host(
    recipe_path: Path, board: str, out_dir: Path, overrides: dict[str, object]
) -> dict[str, Any]:
    """Train on ``board`` and compare its final eval metrics with the host's on the retrieved model."""
    summary = run_on_board(recipe_path, board, out_dir, overrides=overrides, validate=False)
    recipe = load_recipe(recipe_path, overrides)
    if recipe.data.eval is None:
        raise EvaluationError(f"{recipe.name}: the comparison needs data.eval (the set the board evaluates)")
    prep = prepared(inputs(recipe))
    loss = host_loss(recipe, prep)
    model = summary.retrieved.files["inference"]
    board_m = summary.training.result.metrics
    host_eval = evaluate(model, recipe.data.eval, recipe.task, loss=loss)
    host_test = evaluate(model, recipe.data.test, recipe.task, loss=loss)
    row: dict[str, Any] = {
        "recipe": recipe.name,
        "batchnorm": recipe.trainable.batchnorm,
        "loss_kind": host_eval["loss_kind"],
        "board_train_loss": board_m.get("train_loss"),
        "board_eval_loss": board_m["eval_loss"],
        "host_eval_loss": host_eval["loss"],
        "loss_rel_diff": relative(board_m["eval_loss"], host_eval["loss"]),
        "test_loss": host_test["loss"],
        "training_graph_eval_loss": training_graph_loss(
            prep, model, recipe.data.eval, recipe.training.batch_size
        ),
    }
    row["train_infer_rel_gap"] = relative(row["training_graph_eval_loss"], host_eval["loss"])
    if "eval_accuracy" in board_m:
        row.update(
            board_eval_accuracy=board_m["eval_accuracy"],
            host_eval_accuracy=host_eval["accuracy"],
            test_accuracy=host_test["accuracy"],
        )
    return row


def training_graph_loss(prep: Any, inference_onnx: Path, data: Path, batch_size: int) -> float:
    """Mean loss of the prepared training graph (ORT's, or the autograd runtime's train step through
    the agent's own module), run forward in training mode with the weights of ``inference_onnx`` on
    ``data`` (no optimizer step), batch by batch like the board."""
    trained = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(inference_onnx)).graph.initializer}
    if prep.manifest.get("runtime") == "autograd":
        module = _autograd_module(prep, trained)
    else:
        module = _ort_module(prep, trained)
    module.train()
    with np.load(data) as npz:
        arrays = [npz[prep.manifest["feeds"][name]] for name in module.input_names()]
    total, n = 0.0, len(arrays[0])
    for start in range(0, n, batch_size):
        batch = [a[start : start + batch_size] for a in arrays]
        out = module(*batch)
        first = out[0] if isinstance(out, (list, tuple)) else out
        total += float(np.asarray(first, dtype=np.float64).reshape(-1)[0]) * len(batch[0])
    return total / max(1, n)


def _ort_module(prep: Any, trained: dict[str, np.ndarray]) -> Any:
    """ORT's training module of ``prep`` holding the ``trained`` tensors."""
    api, ort = load_training_api(), load_onnxruntime()
    seed_runtime(0)
    art = prep.artifacts_dir
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
    module = api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
    # the module's parameter buffer follows the training graph's inputs (Parameter.data cannot be
    # set in ORT 1.19.2: it crashes); read back to be sure every tensor landed where it belongs
    names = set(prep.manifest["trainable"])
    order = [i.name for i in onnx.load(str(art / "training_model.onnx")).graph.input if i.name in names]
    flat = np.concatenate([trained[n].astype(np.float32).ravel() for n in order])
    module.copy_buffer_to_parameters(ort.OrtValue.ortvalue_from_numpy(flat)._ortvalue, True)
    if not all(np.array_equal(state.parameters[n].data, trained[n]) for n in order):
        raise EvaluationError("the trained weights did not land in the training graph's parameters")
    return module


def _autograd_module(prep: Any, trained: dict[str, np.ndarray]) -> Any:
    """The board agent's autograd module of ``prep`` (its train step, noise from seed 0) holding
    the ``trained`` tensors."""
    art = prep.artifacts_dir
    api = AutogradApi(art / "step.json", art / "inference_template.onnx")
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint.npz"))
    for name in prep.manifest["trainable"]:
        state.parameters[name].data = trained[name].astype(np.float32)
    return api.Module(str(art / "train_step.onnx"), state, str(art / "eval_step.onnx"))
