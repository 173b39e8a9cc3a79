"""BatchNorm statistics re-measured on the recipe's data before export (issue 37, item 3:
``[trainable] batchnorm_calibration``): the statistics are the cumulative average of the batches'
with Dropout off and nothing else changed; a DS-CNN from random init no longer collapses its
features, so a head trained on frozen statistics learns; one line for what cannot be measured."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import numpy_helper
from torch import nn

from tasks.errors import RecipeError
from tasks.prepare.export.bn_calibration import BATCH, batches, calibrated, measure
from tasks.recipe.load import parse_recipe
from tests.prepare.kit import merge, tiny_recipe
from tests.prepare.seq_kit import DSCNN


@pytest.fixture(autouse=True)
def one_thread():
    """torch's OpenMP threads spin on a busy machine: these small models run 10-50x faster on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class ConvDropBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.drop = nn.Dropout(0.9)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(self.drop(self.conv(x)))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 20), batch=st.integers(2, 9), shift=st.floats(-3, 3), scale=st.floats(0.1, 5))
@example(n=9, batch=4, shift=0.0, scale=1.0)  # a last batch of one row joins the one before
def test_statistics_are_the_average_over_batches_with_dropout_off(n, batch, shift, scale):
    torch.manual_seed(0)
    model = ConvDropBN()
    model.bn.momentum = 0.3
    x = (np.random.default_rng(n).standard_normal((n, 2, 4, 4)) * scale + shift).astype(np.float32)
    weights = {k: v.clone() for k, v in model.named_parameters()}
    assert measure(model, [x], batch) == 1
    with torch.no_grad():
        parts = [model.conv(torch.from_numpy(x[rows])) for rows in batches(n, batch)]
    assert min(len(p) for p in parts) >= 2 and sum(len(p) for p in parts) == n
    mean = torch.stack([p.mean((0, 2, 3)) for p in parts]).mean(0)
    var = torch.stack([p.transpose(0, 1).reshape(3, -1).var(1) for p in parts]).mean(0)
    torch.testing.assert_close(model.bn.running_mean, mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.bn.running_var, var, rtol=1e-4, atol=1e-5)
    assert model.bn.momentum == 0.3 and model.training and model.bn.training  # flags restored
    assert all(torch.equal(weights[k], v) for k, v in model.named_parameters())  # no weight moved


def _keywords(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """[N, 1, 20, 10] 'spectrograms' whose class is their loudness (noise of std 0.5 to 3.5), with an
    offset and gain that the statistics of a fresh init (mean 0, variance 1) do not fit."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    x = rng.standard_normal((n, 1, 20, 10)) * (0.5 + y)[:, None, None, None]
    return (4 * x + 2).astype(np.float32), y.astype(np.int64)


def _head_accuracy(model: DSCNN, x: np.ndarray, y: np.ndarray, steps: int = 100) -> float:
    """Train only the classifier on frozen statistics (eval mode), as the board's 'frozen' BatchNorm
    does, and return its training accuracy."""
    model.eval()
    opt = torch.optim.Adam(model.fc.parameters(), lr=0.1)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    with torch.no_grad():
        feats = model.features(xt)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model.fc(feats), yt).backward()
        opt.step()
    return float((model.fc(feats).argmax(1) == yt).float().mean())


def test_random_init_ds_cnn_learns_on_frozen_statistics_only_once_they_are_measured(tmp_path):
    x, y = _keywords(128, 0)
    (tmp_path / "data").mkdir()
    for name in ("train", "test"):
        np.savez(tmp_path / "data" / f"{name}.npz", x=x, y=y)
    recipe = tiny_recipe(tmp_path, {"model": {"input_shape": [1, 20, 10], "num_classes": 4},
                                    "trainable": {"batchnorm_calibration": 64}})  # fmt: skip
    torch.manual_seed(0)
    raw, measured = DSCNN(), DSCNN()
    measured.load_state_dict(raw.state_dict())
    calibrated(recipe, measured)
    with torch.no_grad():
        stds = [float(m.eval().features(torch.from_numpy(x)).std()) for m in (raw, measured)]
    assert stds[0] < 1e-3 < 1e-2 < stds[1]  # collapsed features, then normal ones
    assert _head_accuracy(raw, x, y) < 0.5 < 0.85 < _head_accuracy(measured, x, y)


def test_the_export_holds_the_measured_statistics(tmp_path):
    from tasks.prepare.export.torchscript import export_model

    x, y = _keywords(40, 1)
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "train.npz", x=x, y=y)
    np.savez(tmp_path / "data" / "test.npz", x=x[:8], y=y[:8])
    (tmp_path / "kws.py").write_text("from tests.prepare.seq_kit import DSCNN\n\ndef net(num_classes=4):\n"
                                     "    import torch\n    torch.manual_seed(0)\n    return DSCNN(classes=num_classes)\n")  # fmt: skip
    changes = {"model": {"callable": "kws:net", "input_shape": [1, 20, 10], "num_classes": 4},
               "trainable": {"batchnorm_calibration": 32}, "training": {"batch_size": 8}}  # fmt: skip
    recipe = tiny_recipe(tmp_path, changes)
    model = onnx.load(str(export_model(recipe, tmp_path / "out")))
    torch.manual_seed(0)
    reference = DSCNN()
    measure(reference, [x[:32]], BATCH)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for name, buf in reference.state_dict().items():
        if name.endswith(("running_mean", "running_var")):
            np.testing.assert_allclose(inits[name], buf.numpy(), rtol=1e-5, atol=1e-6)


def test_what_cannot_be_measured_is_one_line_naming_the_field(tmp_path):
    recipe = tiny_recipe(tmp_path, {"trainable": {"batchnorm_calibration": 16}})
    with pytest.raises(RecipeError, match=r"trainable.batchnorm_calibration.*a data.train file on the host"):
        calibrated(recipe, DSCNN())  # no data made yet
    with pytest.raises(RecipeError, match=r"a model with BatchNorm layers to measure \(this one has none\)"):
        calibrated(recipe, nn.Sequential(nn.Linear(2, 2)))
    onnx_recipe = merge(recipe.raw, {"model": {"callable": None, "onnx": "m.onnx"}})
    (tmp_path / "m.onnx").write_bytes(b"")
    with pytest.raises(RecipeError, match=r"'trainable.batchnorm_calibration': expected 0 for an ONNX model"):
        parse_recipe(onnx_recipe, tmp_path / "recipe.toml")
