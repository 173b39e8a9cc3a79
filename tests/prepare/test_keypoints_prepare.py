"""A keypoints recipe prepares whichever output its model has: heatmaps at a stride (a strided conv)
or coordinates [N, K, 2] (a linear head reshaped): export, artifacts with the keypoints MSE in the
training graph, the offline validation and the judging rehearsal, whose host evaluation reports OKS
AP and the same loss kind; a model of another output shape is refused in one line before training."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import PipelineError
from tests.prepare.kit import BASE, merge

MODELS = """
import numpy as np
import torch
from torch import nn

K = 3


class Heatmaps(nn.Module):  # [N, 1, 8, 8] -> [N, K, 4, 4]
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Conv2d(8, K, 2, stride=2)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)))


class Coordinates(nn.Module):  # [N, 1, 8, 8] -> [N, K, 2]
    def __init__(self, k=K):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, k * 2)
        self.k = k

    def forward(self, x):
        return self.head(torch.flatten(torch.relu(self.conv(x)), 1)).reshape(-1, self.k, 2) + 4.0


def heatmaps():
    torch.manual_seed(0)
    return Heatmaps()


def coordinates(k=K):
    torch.manual_seed(0)
    return Coordinates(k)


def make(out_dir):
    rng = np.random.default_rng(0)
    for name, n in (("train", 64), ("test", 24)):
        y = np.zeros((n, K, 3), np.float32)
        y[..., :2] = rng.uniform(0.5, 7.5, (n, K, 2))
        y[..., 2] = 2
        x = np.zeros((n, 1, 8, 8), np.float32)
        for i in range(n):
            for px, py, _ in y[i]:
                x[i, 0, int(py), int(px)] = 1.0
        np.savez(out_dir / f"{name}.npz", x=x, y=y)
"""


def _recipe(folder, callable_: str, **model):
    from tasks.recipe.load import parse_recipe

    (folder / "posemodels.py").write_text(MODELS)
    changes = {"name": "pose", "task": "keypoints", "loss": {"kind": "mse"}, "keypoints": {"count": 3},
               "trainable": {"strategy": "all"}, "promotion": {"metric": "oks_ap"},
               "model": {"callable": callable_, "num_classes": None, "input_shape": [1, 8, 8], **model},
               "data": {"make": "posemodels:make"}}  # fmt: skip
    return parse_recipe(merge(BASE, changes), folder / "recipe.toml")


@pytest.mark.parametrize(("model", "output", "loss"), [
    ("posemodels:heatmaps", "heatmaps", "mse of heatmaps (Gaussian targets, sigma 2)"),
    ("posemodels:coordinates", "coordinates", "mse of coordinates"),
])  # fmt: skip
def test_a_keypoints_recipe_prepares_heatmaps_or_coordinates(tmp_path, model, output, loss):
    from tasks import stages
    from tasks.judge.evaluate import evaluate
    from tasks.judge.losses import host_loss

    recipe = _recipe(tmp_path, model)
    prep = stages.prepare(stages.inputs(recipe))
    assert prep.manifest["loss"] == loss
    rehearsed = prep.validation["checks"]["judging_rehearsed"]
    assert rehearsed["test"]["loss_kind"] == rehearsed["held_out"]["loss_kind"] == "keypoints-mse"
    m = evaluate(prep.out_dir / "validation_inference.onnx", recipe.data.test, "keypoints",
                 loss=host_loss(recipe, prep), keypoints=recipe.keypoints)  # fmt: skip
    assert m["output"] == output and 0.0 <= m["oks_ap"] <= 1.0 and len(m["per_sample"]["pck"]) == 24
    assert np.isfinite(m["loss"])


def test_an_output_of_another_shape_is_refused_before_training(tmp_path):
    from tasks import stages

    recipe = _recipe(tmp_path, "posemodels:coordinates", kwargs={"k": 4})
    with pytest.raises(PipelineError) as err:
        stages.prepare(stages.inputs(recipe))
    assert "\n" not in str(err.value)
    assert "[batch, K=3, H, W] (heatmaps) or [batch, K=3, 2] (coordinates)" in str(err.value)
