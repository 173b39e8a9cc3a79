"""BatchNorm in the autograd runtime's steps, as ``trainable.batchnorm`` says: ``batch-stats`` trains
on the batch's statistics (PyTorch in training mode, its running statistics left as they were) and
evaluates on the running ones; ``frozen`` (the digits tests) trains on the running ones."""

from __future__ import annotations

import numpy as np
import onnxruntime
import torch

from device_agent.runtimes.weights import whole_model
from tasks.prepare.export.torch_model import build_model
from tasks.prepare.pipeline import prepare
from tests.prepare.kit import tiny_recipe


def test_batch_stats_train_on_the_batch_and_evaluate_on_the_running_statistics(tmp_path):
    recipe = tiny_recipe(tmp_path, {"trainable": {"strategy": "all", "batchnorm": "batch-stats"},
                                    "training": {"runtime": "autograd"}})  # fmt: skip
    art = prepare(recipe, tmp_path / "out").artifacts_dir
    with np.load(art / "checkpoint.npz") as ckpt:
        weights = dict(ckpt)
    data = np.load(recipe.data.train)
    x, y = data["x"][:6], data["y"][:6].astype(np.int64)
    model = build_model(recipe)
    model.load_state_dict({n: torch.from_numpy(w) for n, w in weights.items()}, strict=False)
    before = {n: b.clone() for n, b in model.named_buffers()}
    train = onnxruntime.InferenceSession(str(art / "train_step.onnx")).run(
        None, {"input": x, "labels": y, **weights}
    )
    model.train()
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    assert abs(train[0] - loss.item()) <= 1e-5 * max(1.0, loss.item())
    for (name, p), grad in zip(model.named_parameters(), train[2:], strict=True):
        assert np.abs(grad - p.grad.numpy()).max() <= 1e-5 * max(1.0, p.grad.abs().max().item()), name
    model.load_state_dict(before, strict=False)  # PyTorch's training step moved them; the runtime's not
    evaluated = onnxruntime.InferenceSession(whole_model(art / "eval_step.onnx")).run(
        None, {"input": x, "labels": y, **weights}
    )
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(
            model.eval()(torch.from_numpy(x)), torch.from_numpy(y)
        ).item()
    assert abs(evaluated[0] - want) <= 1e-5 * max(1.0, want)
    assert abs(evaluated[0] - train[0]) > 1e-4  # batch and running statistics differ here
