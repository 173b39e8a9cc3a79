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
from tasks.errors import EvaluationError
from tasks.judge.evaluate import evaluate
from tasks.judge.losses import host_loss
from tasks.quiet import ort_session
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
    """Mean loss of the prepared training graph (ORT's, or the autograd runtime's train step), run
    forward in training mode with the weights of ``inference_onnx`` on ``data`` (no optimizer
    step), batch by batch like the board."""
    if prep.manifest.get("runtime") == "autograd":
        return _train_step_loss(prep, inference_onnx, data, batch_size)
    api, ort = load_training_api(), load_onnxruntime()
    seed_runtime(0)
    art = prep.artifacts_dir
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
    module = api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
    trained = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(inference_onnx)).graph.initializer}
    # the module's parameter buffer follows the training graph's inputs (Parameter.data cannot be
    # set in ORT 1.19.2: it crashes); read back to be sure every tensor landed where it belongs
    names = set(prep.manifest["trainable"])
    order = [i.name for i in onnx.load(str(art / "training_model.onnx")).graph.input if i.name in names]
    flat = np.concatenate([trained[n].astype(np.float32).ravel() for n in order])
    module.copy_buffer_to_parameters(ort.OrtValue.ortvalue_from_numpy(flat)._ortvalue, True)
    if not all(np.array_equal(state.parameters[n].data, trained[n]) for n in order):
        raise EvaluationError("the trained weights did not land in the training graph's parameters")
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


def _train_step_loss(prep: Any, inference_onnx: Path, data: Path, batch_size: int) -> float:
    """:func:`training_graph_loss` of ``train_step.onnx``: its loss output with the trained tensors
    as its inputs (a noise input, if any, drawn from seed 0)."""
    import json

    art = prep.artifacts_dir
    step = json.loads((art / "step.json").read_text())
    trained = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(inference_onnx)).graph.initializer}
    weights = {t["name"]: trained[t["name"]].astype(np.float32) for t in step["trainable"]}
    session = ort_session(str(art / "train_step.onnx"))
    rng = np.random.default_rng(0)
    with np.load(data) as npz:
        arrays = [npz[prep.manifest["feeds"][f["name"]]] for f in step["feeds"]]
    total, n = 0.0, len(arrays[0])
    for start in range(0, n, batch_size):
        batch = [a[start : start + batch_size] for a in arrays]
        noise = {d["name"]: rng.random([len(batch[0]) if s == "batch" else s for s in d["shape"]], dtype=np.float32)
                 for d in step.get("noise", [])}  # fmt: skip
        feeds = {f["name"]: a for f, a in zip(step["feeds"], batch, strict=True)} | weights | noise
        (loss,) = session.run([step["outputs"][0]], feeds)
        total += float(np.asarray(loss, dtype=np.float64).reshape(-1)[0]) * len(batch[0])
    return total / max(1, n)
