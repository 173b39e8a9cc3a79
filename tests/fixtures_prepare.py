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


def _prepared(tmp_path_factory: pytest.TempPathFactory, recipe_file: str):
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    return prepare(load_recipe(RECIPES / recipe_file, ORT), tmp_path_factory.mktemp(Path(recipe_file).stem))


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
    """Prepared recipes/mobilenet_v2.toml (slow: ~15 s; use only in tests marked slow)."""
    return _prepared(tmp_path_factory, "mobilenet_v2.toml")
