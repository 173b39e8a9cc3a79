"""Models the ORT runtime stops on prepare and train under the autograd runtime without a rewrite:
a frozen GRU between trainable layers (ONNX Runtime 1.19.2's gradient crashes through it) and
``F.fold`` (``aten::col2im``, which the opset-17 export lacks); an upsampling to a size read from
another tensor trains under both."""

from __future__ import annotations

import pytest

from tasks.errors import PipelineError
from tasks.prepare.pipeline import prepare
from tests.fixtures_prepare import needs_ort_training
from tests.prepare.kit import tiny_recipe

MODULE = """
import torch
from torch import nn
import torch.nn.functional as F


class FrozenGru(nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.gru = nn.GRU(16, 8, batch_first=True)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        h, _ = self.gru(torch.relu(self.conv(x)).flatten(2))  # 4 channels as 4 steps of 16 pixels
        return self.head(h[:, -1])


class Fold(nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.mix = nn.Linear(9, 9)
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        cols = self.mix(F.unfold(x, 3, padding=1).transpose(1, 2)).transpose(1, 2)
        return self.head(torch.flatten(F.fold(cols, (4, 4), 3, padding=1), 1))


class SizedResize(nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        y = torch.relu(self.conv1(x))
        z = F.interpolate(torch.relu(self.conv2(y)), size=y.shape[-2:], mode="bilinear", align_corners=False)
        return self.head(torch.flatten(z + y, 1))


def frozen_gru(num_classes=3):
    return FrozenGru(num_classes)


def fold(num_classes=3):
    return Fold(num_classes)


def sized_resize(num_classes=3):
    return SizedResize(num_classes)
"""
CASES = {
    "frozen_gru": ({"strategy": None, "patterns": ["conv.*", "head.*"]}, "GRU"),
    "fold": ({"strategy": "all"}, "col2im"),
    "sized_resize": ({"strategy": "all"}, None),
}


def _prepare(folder, name, runtime):
    trainable, _ = CASES[name]
    changes = {
        "model": {"callable": f"hardmodels:{name}"},
        "trainable": trainable,
        "training": {"runtime": runtime},
    }
    folder.mkdir()
    recipe = tiny_recipe(folder, changes)
    (folder / "hardmodels.py").write_text(MODULE)
    return prepare(recipe, folder / "out")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_what_ort_cannot_train_trains_under_autograd(tmp_path, name):
    done = _prepare(tmp_path / "autograd", name, "autograd")
    repeat = done.validation["repeat_losses"]
    assert done.validation["passed"] and sum(repeat[-3:]) < sum(repeat[:3])
    needs_ort_training()
    words = CASES[name][1]
    if words is None:  # both runtimes train it
        assert _prepare(tmp_path / "ort", name, "ort-training").validation["passed"]
        return
    with pytest.raises(PipelineError, match=words):
        _prepare(tmp_path / "ort", name, "ort-training")
