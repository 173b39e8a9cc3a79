"""The host's Python decides which training runtimes it can prepare: ``ort-training`` needs
onnxruntime-training, which has no wheel past Python 3.11 (tasks/recipe/host_runtime.py)."""

from __future__ import annotations

import pytest

from tasks.errors import RecipeError
from tasks.recipe import host_runtime
from tasks.recipe.host_runtime import ort_training_installed, why_no_ort_training
from tasks.recipe.load import load_recipe
from tests.fixtures_prepare import RECIPES


def test_why_names_the_python_and_the_missing_package() -> None:
    assert why_no_ort_training((3, 11), installed=True) is None
    assert why_no_ort_training((3, 13), installed=True) is None  # a build of one's own counts
    newer = why_no_ort_training((3, 13), installed=False)
    assert newer is not None and "no wheel for Python 3.13" in newer
    older = why_no_ort_training((3, 11), installed=False)
    assert older is not None and "not installed in this Python 3.11" in older


def test_installed_reads_the_distributions_metadata() -> None:
    assert ort_training_installed(("odl-no-such-distribution",)) is False
    assert ort_training_installed(("pytest",)) is True


def test_ort_training_recipe_refused_in_one_line_on_a_newer_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        host_runtime, "why_no_ort_training", lambda: why_no_ort_training((3, 13), installed=False)
    )
    with pytest.raises(RecipeError) as caught:
        load_recipe(RECIPES / "digits.toml", {"training.runtime": "ort-training"})
    message = str(caught.value)
    assert caught.value.field == "training.runtime" and "\n" not in message
    assert "'autograd' on this host" in message and "Python 3.13" in message
    assert load_recipe(RECIPES / "digits.toml").training.runtime == "autograd"  # the default loads there
