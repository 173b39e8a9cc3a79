"""Session fixtures of the foundation area: the digits recipe prepared once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT

RECIPES = PROJECT_ROOT / "recipes"


@pytest.fixture(scope="session")
def digits_recipe():
    """The reference digits recipe (its data are generated under recipes/data/ on first use)."""
    from tasks.recipe import load_recipe

    return load_recipe(RECIPES / "digits.toml")


@pytest.fixture(scope="session")
def prepared_digits(tmp_path_factory: pytest.TempPathFactory, digits_recipe):
    """tasks.prepare.Prepared for recipes/digits.toml (export, artifacts, validation) in a session tmp dir."""
    from tasks.prepare import prepare

    out: Path = tmp_path_factory.mktemp("prepared_digits")
    return prepare(digits_recipe, out)
