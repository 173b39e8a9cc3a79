"""A random draw whose size is a multiple of the batch (patches folded into the batch axis, as
MobileViT's transformer drops them) is a ``(batch, count)`` noise input the step lays out as the
draw: the train step takes any batch and its loss and gradients are PyTorch's for that noise. A draw
of another size of the batch is refused in one whole line that writes its shape with ``batch``."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest
import torch

from tasks.errors import ModelError
from tests.runtimes.kit import assert_step_equals, prepared_module, torch_model

P = 0.5
MODULE = f"""
import torch
from torch import nn


class PatchDrop(nn.Module):
    # 4 patches of 2 x 2 pixels per sample, each a row of the batch, dropped as MobileViT drops them

    def __init__(self, num_classes=3):
        super().__init__()
        self.conv, self.drop, self.head = nn.Conv2d(1, 4, 3, padding=1), nn.Dropout({P}), nn.Linear(64, num_classes)

    def forward(self, x):
        y, b = self.conv(x).relu(), x.shape[0]
        patches = y.reshape(b, 4, 2, 2, 2, 2).permute(0, 2, 4, 3, 5, 1).reshape(b * 4, 4, 4)
        return self.head(self.drop(patches).reshape(b, 64))


class PairDrop(PatchDrop):
    # a draw per pair of samples: batch x batch rows, which no fixed count per sample gives

    def forward(self, x):
        b = x.shape[0]
        return super().forward(x) * (torch.rand(b * b, 3) > 0.5).float().reshape(b, b, 3).mean(1)
"""


def _reference(recipe, weights, x, y, noise):
    """Loss and gradients by PyTorch, the dropout mask drawn from ``noise`` as the patches' rows."""
    model = torch_model(recipe, weights)
    h = torch.relu(model.conv(torch.from_numpy(x)))
    b = h.shape[0]
    patches = h.reshape(b, 4, 2, 2, 2, 2).permute(0, 2, 4, 3, 5, 1).reshape(b * 4, 4, 4)
    mask = torch.from_numpy(noise).reshape(b * 4, 4, 4) > P
    logits = model.head((patches * mask / (1 - P)).reshape(b, 64))
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
    loss.backward()
    return loss.item(), {n: p.grad.numpy() for n, p in model.named_parameters()}


@pytest.fixture
def patch_prepared(tmp_path_factory, traced_steps):
    """The traced path's draw (the graph path's, a [batch, 4, 4, 4] noise input, is
    tests/runtimes/test_graph_rules.py's)."""
    folder = tmp_path_factory.mktemp("patches")
    return prepared_module(folder, "patchdrop", MODULE, {"model": {"callable": "patchdrop:PatchDrop"}})


def test_a_draw_of_a_multiple_of_the_batch_trains_at_any_batch(patch_prepared):
    recipe, prepared = patch_prepared
    step = json.loads((prepared.artifacts_dir / "step.json").read_text())
    assert [n["shape"] for n in step["noise"]] == [["batch", 64]]
    session = onnxruntime.InferenceSession(str(prepared.artifacts_dir / "train_step.onnx"))
    with np.load(prepared.artifacts_dir / "checkpoint.npz") as ckpt:
        weights = dict(ckpt)
    data = np.load(recipe.data.train)
    for batch in (5, 2):  # neither the traced batch nor the recipe's
        x, y = data["x"][:batch], data["y"][:batch].astype(np.int64)
        noise = np.random.default_rng(batch).random((batch, 64), dtype=np.float32)
        got = session.run(None, {"input": x, "labels": y, **weights, step["noise"][0]["name"]: noise})
        assert_step_equals(got, step["trainable"], *_reference(recipe, weights, x, y, noise))


def test_a_draw_of_another_size_of_the_batch_is_refused_in_one_whole_line(tmp_path):
    with pytest.raises(ModelError) as info:
        prepared_module(tmp_path, "pairdrop", MODULE, {"model": {"callable": "pairdrop:PairDrop"}})
    message = str(info.value)
    assert "[batch**2, 3]" in message and message.endswith("a fixed multiple of the batch")
    assert "\n" not in message
