"""Buffers are not parameters (issue 37, item 6): a PyTorch model's registered buffers (an audio
front-end's DFT and mel matrices) are never trained by any strategy, a recipe naming one is told so
in one line, and "trains X of Y parameters" counts what torch counts."""

from __future__ import annotations

import json

import onnx
import pytest

from tasks.errors import RecipeError
from tasks.prepare.export.buffers import torch_buffers, torch_parameter_count
from tasks.prepare.trainable import model_parameter_count, parameters, resolve_trainable
from tasks.recipe.load import parse_recipe
from tests.prepare.kit import merge
from tests.prepare.seq_kit import MelNet, export_module, signals

BUFFERS = {"cos", "sin", "mel"}


@pytest.fixture(scope="module")
def mel(tmp_path_factory):
    module = MelNet()
    recipe, model = export_module(module, tmp_path_factory.mktemp("mel"), signals(8, 5, 16))
    return module, recipe, model


def _resolve(recipe, model, trainable: dict):
    return resolve_trainable(parse_recipe(merge(recipe.raw, {"trainable": trainable}), recipe.source), model)


@pytest.mark.parametrize(
    "trainable",
    [{"strategy": "all"}, {"strategy": "suffix", "max_fraction": 1.0}, {"patterns": ["*"]}],
    ids=["all", "suffix", "pattern-star"],
)
def test_no_strategy_trains_a_buffer_and_counts_are_torchs(mel, trainable):
    module, recipe, model = mel
    assert torch_buffers(model) == BUFFERS
    chosen, frozen, _ = _resolve(recipe, model, trainable)
    used = {"conv.weight", "conv.bias", "fc.weight", "fc.bias"}  # 'unused' is dropped by the exporter
    assert set(chosen) == used and BUFFERS <= set(frozen)
    assert model_parameter_count(model) == sum(p.numel() for p in module.parameters()) == 73
    assert torch_parameter_count(model) == 73 and set(parameters(model)) == used


def test_a_recipe_naming_a_buffer_is_told_it_is_one(mel):
    _, recipe, model = mel
    with pytest.raises(RecipeError) as caught:
        _resolve(recipe, model, {"names": ["fc.weight", "mel"]})
    text = str(caught.value)
    assert "'mel' is a registered buffer of the model" in text and "never train" in text
    with pytest.raises(RecipeError, match=r"it matches only registered buffers \(mel\)") as caught:
        _resolve(recipe, model, {"patterns": ["fc.*", "me*"]})
    assert "\n" not in str(caught.value)


def test_an_onnx_file_without_the_record_keeps_its_float_initializers_as_parameters(mel):
    _, _, model = mel
    plain = onnx.ModelProto()
    plain.CopyFrom(model)
    del plain.metadata_props[:]
    assert torch_buffers(plain) == set() and torch_parameter_count(plain) is None
    assert BUFFERS <= set(parameters(plain))
    assert model_parameter_count(plain) == sum(parameters(plain).values())


def test_the_manifest_counts_torchs_parameters(mel, tmp_path):
    from tasks.prepare.runtimes.ort_training.artifacts import generate

    module, recipe, _ = mel
    recipe = parse_recipe(merge(recipe.raw, {"trainable": {"strategy": "all"}}), recipe.source)
    manifest = generate(recipe, recipe.base_dir / "model.onnx", tmp_path)
    assert manifest["model_params"] == sum(p.numel() for p in module.parameters())
    assert manifest["trainable_count"] == 73 - 6  # all but the unused layer
    assert not BUFFERS & set(json.loads((tmp_path / "manifest.json").read_text())["trainable"])


def test_the_autograd_runtimes_export_records_the_buffers_too(mel, tmp_path):
    from tasks.prepare.runtimes.autograd.build import export_model

    _, recipe, _ = mel
    (recipe.base_dir / "melnet.py").write_text(
        "from tests.prepare.seq_kit import MelNet\n\n\ndef net(num_classes=3):\n    return MelNet(classes=num_classes)\n"
    )
    changes = {"model": {"callable": "melnet:net"}, "training": {"runtime": "autograd"}}
    recipe = parse_recipe(merge(recipe.raw, changes), recipe.source)
    model = onnx.load(str(export_model(recipe, tmp_path)))
    assert torch_buffers(model) == BUFFERS and model_parameter_count(model) == 73
    chosen, _, _ = _resolve(recipe, model, {"strategy": "all"})
    assert not BUFFERS & set(chosen)
