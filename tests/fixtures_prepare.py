"""Session fixtures of the foundation area: the digits recipe prepared once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT
from tasks.recipe.host_runtime import why_no_ort_training

RECIPES = PROJECT_ROOT / "recipes"
# these fixtures prepare for the ORT-training runtime (the default is autograd): the tests that use them
# read ONNX Runtime's training artifacts (training/eval/optimizer graphs, checkpoint)
ORT = {"training.runtime": "ort-training"}


def needs_ort_training() -> None:
    """Skip the rest of a test (what it checked so far stands) where the host has no
    onnxruntime-training: its ORT-training half cannot run there (no wheel for Python >= 3.12)."""
    why = why_no_ort_training()
    if why:
        pytest.skip(f"the ORT-training half needs onnxruntime-training: {why}")


@pytest.fixture(scope="session")
def digits_recipe():
    """The reference digits recipe under ``ort-training`` (its data are generated under recipes/data/
    on first use)."""
    from tasks.recipe.load import load_recipe

    return load_recipe(RECIPES / "digits.toml", ORT)


@pytest.fixture(scope="session")
def prepared_digits(tmp_path_factory: pytest.TempPathFactory, digits_recipe):
    """tasks.prepare.Prepared for recipes/digits.toml (export, artifacts, validation) in a session tmp dir."""
    from tasks.prepare.pipeline import prepare

    out: Path = tmp_path_factory.mktemp("prepared_digits")
    return prepare(digits_recipe, out)


def _prepared(tmp_path_factory: pytest.TempPathFactory, recipe_file: str, overrides: dict | None = None):
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(RECIPES / recipe_file, {**ORT, **(overrides or {})})
    return prepare(recipe, tmp_path_factory.mktemp(Path(recipe_file).stem))


@pytest.fixture(scope="session")
def prepared_embedded(tmp_path_factory: pytest.TempPathFactory):
    """Prepared recipes/embedded_loss.toml (loss computed inside the model)."""
    return _prepared(tmp_path_factory, "embedded_loss.toml")


@pytest.fixture(scope="session")
def prepared_two_head(tmp_path_factory: pytest.TempPathFactory):
    """Prepared recipes/two_head_custom_loss.toml (custom onnxblock loss on two outputs)."""
    return _prepared(tmp_path_factory, "two_head_custom_loss.toml")


@pytest.fixture(scope="session")
def prepared_mobilenet(tmp_path_factory: pytest.TempPathFactory):
    """Prepared recipes/mobilenet_v2.toml (slow: ~30 s; use only in tests marked slow), on a smaller
    share of its data: its 64 test images as the training set for one epoch (the validation's board
    batches check runs 8 batches, not 128) and 16 of them for the BatchNorm calibration. The graph,
    its trainable tensors and every validation check are the recipe's own."""
    small = {
        "data.train": "data/textures/test.npz",
        "training.epochs": 1,
        "trainable.batchnorm_calibration": 16,
    }
    return _prepared(tmp_path_factory, "mobilenet_v2.toml", small)
