"""``training.runtime`` in the recipe: the default, and what the autograd runtime refuses in one line."""

from __future__ import annotations

import pytest

from tasks.errors import RecipeError
from tasks.recipe.load import load_recipe, parse_recipe
from tests.fixtures_prepare import RECIPES

AUTOGRAD = {"training.runtime": "autograd"}
ORT = {"training.runtime": "ort-training"}
SGD = {"optimizer.kind": "sgd"}


@pytest.mark.ort_training  # digits.toml under ort-training loads only where the host can build it
def test_the_default_runtime_is_autograd():
    assert load_recipe(RECIPES / "digits.toml").training.runtime == "autograd"
    assert load_recipe(RECIPES / "digits.toml", ORT).training.runtime == "ort-training"


def test_an_onnx_model_takes_the_autograd_runtime():
    """Transfer learning from an ONNX file under autograd (its PyTorch twin: tests/runtimes/test_autograd_onnx_in.py)."""
    recipe = load_recipe(RECIPES / "digits_onnx.toml", AUTOGRAD)
    assert recipe.model.kind == "onnx" and recipe.training.runtime == "autograd"


@pytest.mark.parametrize(
    ("recipe", "overrides", "field", "words"),
    [
        (
            "digits.toml",
            {"loss.torch": "models:twin"},
            "loss.torch",
            "only with loss.kind = 'custom:module:factory'",
        ),
        ("digits.toml", {"training.runtime": "torch"}, "training.runtime", "'ort-training' or 'autograd'"),
        pytest.param(
            "digits.toml",
            {**ORT, **SGD, "optimizer.momentum": 0.9},
            "optimizer.momentum",
            "ONNX Runtime's SGD has no momentum",
            marks=pytest.mark.ort_training,
        ),
        (
            "digits.toml",
            {**AUTOGRAD, "optimizer.momentum": 0.9},
            "optimizer.momentum",
            "optimizer.kind = 'adamw'",
        ),
        (
            "digits.toml",
            {**AUTOGRAD, **SGD, "optimizer.momentum": 1.0},
            "optimizer.momentum",
            "a number in [0, 1)",
        ),
        (
            "digits.toml",
            {**AUTOGRAD, **SGD, "optimizer.nesterov": True},
            "optimizer.nesterov",
            "momentum > 0",
        ),
        (
            "two_head_custom_loss.toml",
            {**AUTOGRAD, "loss.torch": "not a ref"},
            "loss.torch",
            "'module:callable'",
        ),
    ],
)
def test_autograd_refusals_name_the_field(recipe, overrides, field, words):
    with pytest.raises(RecipeError) as info:
        load_recipe(RECIPES / recipe, overrides)
    line = str(info.value)
    assert f"'{field}'" in line and words in line and "\n" not in line


def test_a_custom_loss_with_its_twin_loads():
    recipe = load_recipe(
        RECIPES / "two_head_custom_loss.toml", {**AUTOGRAD, "loss.torch": "models:two_head_loss_torch"}
    )
    assert (recipe.loss.kind, recipe.loss.factory, recipe.loss.torch) == (
        "custom",
        "models:two_head_loss",
        "models:two_head_loss_torch",
    )


@pytest.mark.ort_training  # parses two_head_custom_loss.toml under ort-training too
def test_a_custom_loss_without_its_twin_is_refused_for_autograd():
    recipe = load_recipe(RECIPES / "two_head_custom_loss.toml")
    raw = {**recipe.raw, "loss": {"kind": recipe.raw["loss"]["kind"]}, "training": {"runtime": "autograd"}}
    with pytest.raises(RecipeError) as info:
        parse_recipe(raw, recipe.source)
    line = str(info.value)
    assert "'loss.torch'" in line and "a PyTorch twin of the custom loss models:two_head_loss" in line
    assert (
        parse_recipe({**raw, "training": {"runtime": "ort-training"}}, recipe.source).loss.torch is None
    )  # the ORT runtime needs none


def test_sgd_momentum_reaches_the_autograd_step_spec():
    from tasks.prepare.runtimes.autograd.build import optimizer

    recipe = load_recipe(
        RECIPES / "digits.toml", {**AUTOGRAD, **SGD, "optimizer.momentum": 0.9, "optimizer.nesterov": True}
    )
    assert optimizer(recipe) == {"kind": "sgd", "lr": 1e-3, "momentum": 0.9, "nesterov": True}
    assert optimizer(load_recipe(RECIPES / "digits.toml", {**AUTOGRAD, **SGD}))["momentum"] == 0.0
