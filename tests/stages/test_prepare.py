"""The stage API's inputs hash, job ids and prepare cache, shared by ``odl run`` and the flow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tasks import stages
from tasks.paths import PROJECT_ROOT
from tasks.recipe.load import load_recipe

RECIPES = PROJECT_ROOT / "recipes"


@pytest.fixture
def recipe_copy(tmp_path: Path, digits_recipe) -> Path:
    """The digits recipe and its model module copied into a folder of their own (data shared)."""
    stages.prepare_data(digits_recipe)
    for module in ("models.py", "datasets.py"):
        shutil.copy(RECIPES / module, tmp_path / module)
    text = (RECIPES / "digits.toml").read_text().replace('"data/', f'"{RECIPES}/data/')
    (tmp_path / "digits.toml").write_text(text)
    return tmp_path / "digits.toml"


def test_inputs_cover_recipe_data_weights_and_model_source(digits_recipe):
    stages.prepare_data(digits_recipe)
    hashes = stages.inputs(digits_recipe).hashes
    assert {
        "recipe",
        "data.train",
        "data.test",
        "data.extra_tests.clean",
        "model.weights",
        "model.callable",
    } <= set(hashes)
    assert all(len(h) == 64 for h in hashes.values())


def test_model_source_and_training_fields_change_the_job_but_promotion_does_not(recipe_copy: Path):
    key = stages.inputs(load_recipe(recipe_copy)).key
    assert stages.inputs(load_recipe(recipe_copy, {"promotion.min_gain": 0.5})).key == key
    assert stages.inputs(load_recipe(recipe_copy, {"training.epochs": 3})).key != key
    module = recipe_copy.parent / "models.py"
    module.write_text(module.read_text() + "\n# edited\n")
    edited = stages.inputs(load_recipe(recipe_copy))
    assert edited.key != key
    assert stages.job_id(edited) == f"digits-{edited.key[:12]}"
    assert stages.job_id(edited, "0123-4567-89abcdef") == f"digits-{edited.key[:12]}-0123456789ab"


def test_prepare_reuses_each_done_step_and_redoes_what_is_missing(tmp_path, monkeypatch, digits_recipe):
    monkeypatch.setenv("ODL_HOME", str(tmp_path))
    inp = stages.inputs(load_recipe(RECIPES / "digits.toml", {"training.epochs": 1}))
    first = stages.prepare(inp)
    assert first.out_dir == tmp_path / "prepared" / f"digits-{inp.key[:12]}"
    assert first.validation is not None and first.manifest["trainable_count"] > 0
    stamp = first.model_onnx.stat().st_mtime_ns
    again = stages.prepare(inp)
    assert again.model_onnx.stat().st_mtime_ns == stamp and again.manifest == first.manifest
    (first.out_dir / "manifest.json").unlink()  # a broken folder is rebuilt from that step on
    rebuilt = stages.prepare(inp)
    assert rebuilt.model_onnx.stat().st_mtime_ns == stamp and (first.out_dir / "manifest.json").is_file()
    skipped = stages.prepare(stages.inputs(load_recipe(RECIPES / "digits.toml", {"training.epochs": 2})),
                             validate_recipe=False)  # fmt: skip
    assert skipped.validation is None


def test_one_prepare_builds_a_named_folder_or_the_cached_one(tmp_path, monkeypatch, digits_recipe):
    from tasks.prepare.pipeline import prepare

    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    recipe = load_recipe(RECIPES / "digits.toml", {"training.epochs": 1})
    built = prepare(recipe, tmp_path / "out", validate=False)  # odl prepare: every step, no markers
    assert built.out_dir == (tmp_path / "out").resolve() and built.validation is None
    assert built.manifest == json.loads(built.manifest_path.read_text())
    assert not list(built.out_dir.glob(".done-*"))
    cached = prepare(recipe, validate=False, cache=True)  # odl run and the flow: the inputs' folder
    assert cached == stages.prepared(stages.inputs(recipe))
    assert cached.manifest["trainable"] == built.manifest["trainable"]
    with pytest.raises(ValueError, match="pass no out_dir"):
        prepare(recipe, tmp_path / "elsewhere", cache=True)
