"""Traced (:mod:`tasks.prepare.runtimes.autograd.trace`), a model that computes the same in training
and eval mode (no dropout, BatchNorm frozen) gets its eval step as its train step without the
gradients (one trace and export fewer); one whose modes differ gets its eval step traced in eval
mode. From the exported graph (:mod:`tasks.prepare.runtimes.autograd.graph_step`) each is exported. Either eval step gives PyTorch's eval-mode
loss and outputs."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest
import torch

from device_agent.runtimes.weights import whole_model
from tasks.prepare.export.torch_model import build_model
from tasks.prepare.runtimes.autograd.trace import exported_forward, same_forward
from tests.runtimes.kit import prepared_module

MODULE = """
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes=3, p=0.0):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.drop, self.head = nn.Dropout(p), nn.Linear(4 * 4 * 4, num_classes)

    def forward(self, x):
        return self.head(self.drop(self.bn(self.conv(x)).relu().flatten(1)))


def net(num_classes=3):
    return Net(num_classes)


def dropped(num_classes=3):
    return Net(num_classes, p=0.5)
"""


class _Branch(torch.nn.Module):
    def forward(self, x):
        return x * 2 if self.training else x


def _programs(model, batchnorm="frozen"):
    x = torch.randn(7, 1, 4, 4)
    return [exported_forward(model, (x,), t, batchnorm, 1, ".") for t in (True, False)]


def test_the_modes_compare_by_what_they_compute():
    module = {}
    exec(MODULE, module)  # noqa: S102 - the test's own model source
    assert same_forward(*_programs(module["net"]()))  # a dropout of 0 changes nothing
    assert not same_forward(*_programs(module["dropped"]()))
    assert not same_forward(*_programs(module["net"](), batchnorm="batch-stats"))
    assert not same_forward(*_programs(_Branch()))


@pytest.mark.parametrize("traced", [True, False])
@pytest.mark.parametrize(("builder", "same"), [("net", True), ("dropped", False)])
def test_the_eval_step_gives_pytorch_s_eval_loss(tmp_path, request, builder, same, traced):
    """Traced, a model computing the same in both modes has its eval step derived; from the
    exported graph, each step is its own export (a fraction of a second)."""
    if traced:
        request.getfixturevalue("traced_steps")
    recipe, prepared = prepared_module(
        tmp_path, "evalnet", MODULE, {"model": {"callable": f"evalnet:{builder}"}}
    )
    art = prepared.artifacts_dir
    manifest = json.loads((art.parent / "manifest.json").read_text())
    assert manifest["eval_step_from_train_step"] is (same and traced)
    with np.load(art / "checkpoint.npz") as ckpt:
        weights = dict(ckpt)
    data = np.load(recipe.data.train)
    x, y = data["x"][:5], data["y"][:5].astype(np.int64)
    session = onnxruntime.InferenceSession(whole_model(art / "eval_step.onnx"))  # as the board loads it
    assert [o.name for o in session.get_outputs()] == ["loss", *recipe.model.output_names]
    loss, logits = session.run(None, {"input": x, "labels": y, **weights})
    model = build_model(recipe)  # the checkpoint holds every parameter; the statistics are the initial ones
    model.load_state_dict({n: torch.from_numpy(w) for n, w in weights.items()}, strict=False)
    with torch.no_grad():
        want = model(torch.from_numpy(x))
    np.testing.assert_allclose(logits, want.numpy(), rtol=1e-5, atol=1e-5)
    assert abs(float(loss) - torch.nn.functional.cross_entropy(want, torch.from_numpy(y)).item()) < 1e-5
