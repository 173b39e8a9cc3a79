"""What the autograd runtime does with what stopped it before in a raw traceback or an internal
line (issue 44): a model returning a dict prepares under every task as under the ORT path, and each
stop is one line with the ORT path's advice, no internal name or example batch size."""

from __future__ import annotations

import dataclasses
import logging
import warnings

import numpy as np
import pytest

from tasks.errors import ModelError, RecipeError
from tasks.paths import PROJECT_ROOT
from tasks.recipe.load import load_recipe
from tests.runtimes.kit import prepared_module

DICT_MODELS = """
import collections

import numpy as np
import torch
from torch import nn


class DictOut(nn.Module):
    # torchvision's segmentation models return {"out": scores}

    def __init__(self, classes, pooled):
        super().__init__()
        self.pooled = pooled
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Conv2d(4, classes, 1)

    def forward(self, x):
        y = self.head(torch.relu(self.conv(x)))
        return collections.OrderedDict(out=y.mean(dim=(2, 3)) if self.pooled else y)


def scores(num_classes=3):
    return DictOut(num_classes, pooled=False)


def pooled(num_classes=3):
    return DictOut(num_classes, pooled=True)


def make_seg(out_dir):
    rng = np.random.default_rng(0)
    for name, n in (("train", 32), ("test", 16)):
        x = rng.standard_normal((n, 1, 4, 4)).astype(np.float32)
        np.savez(out_dir / f"{name}.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
"""

SEGMENTATION = {"task": "segmentation", "model": {"callable": "dictmodels:scores"},
                "segmentation": {"classes": ["a", "b", "c"]}, "data": {"make": "dictmodels:make_seg"}}  # fmt: skip
CLASSIFICATION = {"model": {"callable": "dictmodels:pooled"}}


@pytest.mark.parametrize("changes", [SEGMENTATION, CLASSIFICATION], ids=["segmentation", "classification"])
def test_a_dict_output_prepares_as_its_values(tmp_path, changes):
    recipe, prepared = prepared_module(tmp_path, "dictmodels", DICT_MODELS, changes)
    assert prepared.manifest["runtime"] == "autograd"
    assert prepared.manifest["output_names"] == list(recipe.model.output_names)
    with np.load(prepared.artifacts_dir / "checkpoint.npz") as npz:
        assert sorted(npz) == ["conv.bias", "conv.weight", "head.bias", "head.weight"]


@pytest.mark.parametrize(("shape", "words"), [
    ((7, 4, 32, 32), 'of 4 dims (per-pixel class scores [batch, classes, H, W] are task = "segmentation"'),
    ((7, 5), "of shape [batch, 5] (cross-entropy needs [batch, num_classes=4])"),
])  # fmt: skip
def test_a_classification_cross_entropy_on_other_scores_says_what_the_ort_path_says(shape, words):
    import torch

    from tasks.prepare.runtimes.autograd.losses import plan

    recipe = load_recipe(PROJECT_ROOT / "recipes" / "segmentation.toml", {"training.runtime": "autograd"})
    classifier = dataclasses.replace(recipe, task="classification", segmentation=None,
                                     promotion=dataclasses.replace(recipe.promotion, metric="accuracy"))  # fmt: skip
    with pytest.raises(RecipeError) as err:
        plan(classifier, (torch.zeros(shape),), 7)
    message = str(err.value)
    assert err.value.field == "loss.kind" and words in message, message
    assert "7" not in message and "\n" not in message  # no example batch: the trace's own


COMPLEX_STFT = """
import numpy as np
import torch
from torch import nn


class Front(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hann_window(8))

    def forward(self, x):
        spec = torch.stft(x[:, 0], 8, 2, window=self.window, center=False, return_complex=True)
        return torch.log(spec.abs() ** 2 + 1e-4)


class Net(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.front = Front()
        self.fc = nn.Linear(5, classes)

    def forward(self, x):
        return self.fc(self.front(x).mean(-1))


def net(num_classes=3):
    return Net(num_classes)


def make(out_dir):
    rng = np.random.default_rng(0)
    for name, n in (("train", 32), ("test", 16)):
        x = rng.standard_normal((n, 1, 32)).astype(np.float32)
        np.savez(out_dir / f"{name}.npz", x=x, y=(x[:, 0].sum(-1) > 0).astype(np.int64))
"""


def test_a_complex_stft_front_end_is_the_ort_path_s_one_line_with_advice(tmp_path):
    changes = {"model": {"callable": "stftmodels:net", "input_shape": [1, 32]},
               "data": {"make": "stftmodels:make"}}  # fmt: skip
    with pytest.raises(ModelError) as err:
        prepared_module(tmp_path, "stftmodels", COMPLEX_STFT, changes)
    message = str(err.value)
    assert message.startswith("cannot export stftmodels:net to ONNX: operator stft in front (Front): ")
    assert message.endswith("compute the spectrum in front without complex tensors: torch.stft(..., "
                            "return_complex=False), or products with cos and sin DFT matrices held as registered "
                            "buffers"), message  # fmt: skip
    assert "\n" not in message and "%" not in message and "scope" not in message


WARNING_MODEL = """
import warnings

import torch
from torch import nn


class Warns(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4, classes)

    def forward(self, x):
        warnings.warn("the model's own warning", UserWarning)
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def warns(num_classes=3):
    return Warns(num_classes)
"""


def test_a_warning_on_a_passing_prepare_is_a_debug_record_not_a_line(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="tasks.prepare.pipeline")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        prepared_module(tmp_path, "warnmodels", WARNING_MODEL, {"model": {"callable": "warnmodels:warns"}})
    assert not [w for w in shown if "the model's own warning" in str(w.message)]
    assert any(r.levelno == logging.DEBUG and "UserWarning: the model's own warning" in r.getMessage()
               for r in caplog.records if r.name == "tasks.prepare.pipeline")  # fmt: skip


def test_a_branch_on_a_random_draw_is_named_with_its_line_and_the_way_out(tmp_path, capfd):
    """Issue 53: a Hugging Face Wav2Vec2 (LayerDrop: ``if torch.rand([]) < layerdrop``) stopped in
    torch's GuardOnDataDependentSymNode text after two FX graph dumps on stderr. The line names the
    branch (file, line, its source) and what to change; nothing else reaches stderr."""
    import torch
    from torch import nn

    from tasks.prepare.runtimes.autograd.trace import exported_forward

    class LayerDrop(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            if self.training and torch.rand([]) < 0.5:
                return x
            return self.fc(x)

    with pytest.raises(ModelError) as info:
        exported_forward(LayerDrop(), (torch.zeros(2, 3),), True, "frozen", 1, tmp_path)
    text = str(info.value)
    assert "\n" not in text, text
    assert "decides on a tensor's value at " in text and "test_autograd_stops.py:" in text, text
    assert "`if self.training and torch.rand([]) < 0.5:`" in text and "set its probability to 0" in text
    assert "def forward" not in capfd.readouterr().err  # torch.export's partial FX graph stays in the log
