"""A model trained a few steps from prepared artifacts, for judging tests that need trained weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def train_a_few_steps(prep, recipe, inference: Path, steps: int = 3) -> float:
    """Train ``steps`` steps with ORT's training API (as the board does), export ``inference``; return
    the eval graph's loss on the whole test set, the number the board's eval step would report."""
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    arts, feeds = prep.artifacts_dir, prep.manifest["feeds"]
    state = CheckpointState.load_checkpoint(str(arts / "checkpoint"))
    module = Module(str(arts / "training_model.onnx"), state, str(arts / "eval_model.onnx"))
    optimizer = Optimizer(str(arts / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(0.05)
    with np.load(recipe.data.train) as train, np.load(recipe.data.test) as test:
        batch = [train[feeds[n]][:64] for n in module.input_names()]
        whole_test = [test[feeds[n]] for n in module.input_names()]
    module.train()
    for _ in range(steps):
        module(*batch)
        optimizer.step()
        module.lazy_reset_grad()
    module.export_model_for_inferencing(str(inference), prep.manifest["inference_output_names"])
    module.eval()
    out = module(*whole_test)
    return float(np.asarray(out[0] if isinstance(out, (list, tuple)) else out).reshape(-1)[0])
