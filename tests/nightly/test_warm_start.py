"""Warm start: the job's checkpoint carries the registry's current weights, checked by hash."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tasks.checkpoint import checkpoint_weights
from tasks.errors import RegistryError
from tasks.judge.registry import Decision, Registry
from tasks.stages.warm_start import build_warm_checkpoint, model_weights


def _decision(promote: bool = True) -> Decision:
    return Decision(promote, "accuracy", 0.9, 0.1, "base", 0.8, 0.0, "test")


def scaled_model(src: Path, out: Path, factor: float) -> Path:
    """``src`` with every float initializer multiplied by ``factor`` (a version unlike the base)."""
    model = onnx.load(str(src))
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(arr * factor, init.name))
    onnx.save(model, str(out))
    return out


@pytest.fixture
def current_version(tmp_path, prepared_digits):
    from tasks import stages

    base = stages.base_model(prepared_digits)
    model = scaled_model(base, tmp_path / "trained.onnx", 1.5)
    reg = Registry(tmp_path / "registry")
    reg.record("digits", "vboard", model, {"accuracy": 0.9}, _decision())
    return reg, reg.current("digits", "vboard")


def test_checkpoint_gets_every_weight_of_the_current_version(tmp_path, prepared_digits, current_version):
    _, version = current_version
    base_ckpt = prepared_digits.artifacts_dir / "checkpoint"
    warm = build_warm_checkpoint(base_ckpt, version, tmp_path / "warm" / "checkpoint")
    got, want, base = (
        checkpoint_weights(warm.checkpoint),
        model_weights(version.model),
        checkpoint_weights(base_ckpt),
    )
    assert got and set(got) <= set(want)
    for name, arr in got.items():
        np.testing.assert_array_equal(arr, want[name])
    moved = [n for n in got if base[n].dtype == np.float32 and np.abs(base[n]).sum() > 0]
    assert moved and all(not np.array_equal(got[n], base[n]) for n in moved)  # really not the base
    rec = warm.record
    assert rec["from"] == "v0001" and rec["parameters"] == len(got)
    assert rec["model_sha256"] == version.info["model_sha256"]


def test_a_modified_registry_model_is_refused(tmp_path, prepared_digits, current_version):
    _, version = current_version
    scaled_model(version.model, version.model, 2.0)  # edited in place after it was recorded
    with pytest.raises(RegistryError, match="sha256 .* differs .* v0001.*start_from"):
        build_warm_checkpoint(prepared_digits.artifacts_dir / "checkpoint", version, tmp_path / "c")


def test_a_model_of_another_shape_is_refused_naming_the_parameter(tmp_path, prepared_digits):
    from tasks import stages

    model = onnx.load(str(stages.base_model(prepared_digits)))
    init = next(i for i in model.graph.initializer if numpy_helper.to_array(i).ndim == 2)
    name = init.name
    init.CopyFrom(numpy_helper.from_array(np.zeros((3, 3), np.float32), name))
    onnx.save(model, str(tmp_path / "other.onnx"))
    reg = Registry(tmp_path / "registry")
    reg.record("digits", "vboard", tmp_path / "other.onnx", {"accuracy": 0.9}, _decision())
    with pytest.raises(RegistryError, match=rf"parameter '{name}'.*float32\[3, 3\].*start_from = \"base\""):
        build_warm_checkpoint(prepared_digits.artifacts_dir / "checkpoint", reg.current("digits", "vboard"),
                              tmp_path / "c")  # fmt: skip


def test_start_from_is_checked_and_builds_nothing(tmp_path):
    from tasks.errors import RecipeError
    from tasks.recipe.load import load_recipe
    from tasks.stages.prepare import recipe_build_hash

    src = Path("recipes/digits.toml").resolve()
    base = load_recipe(src)
    warm = load_recipe(src, {"training.start_from": "current"})
    assert warm.training.start_from == "current" and base.training.start_from == "base"
    assert recipe_build_hash(warm) == recipe_build_hash(base)  # the same prepared folder
    with pytest.raises(RecipeError, match=r"training\.start_from.*'base' or 'current'"):
        load_recipe(src, {"training.start_from": "latest"})


def test_registry_rollback_walks_back_the_promotions(tmp_path):
    reg = Registry(tmp_path / "registry")
    model = tmp_path / "m.onnx"
    for i, promote in enumerate((True, False, True, True)):
        model.write_bytes(f"model-{i}".encode())
        reg.record("digits", "vboard", model, {"accuracy": 0.5}, _decision(promote))
    assert reg.current("digits", "vboard").name == "v0004"
    assert reg.previous("digits", "vboard").name == "v0003"
    assert reg.rollback("digits", "vboard").name == "v0003"
    assert reg.current("digits", "vboard").name == "v0003"
    assert reg.rollback("digits", "vboard").name == "v0001"  # v0002 was never in service
    with pytest.raises(RegistryError, match="nothing to roll back to .*v0001 is the first promoted"):
        reg.rollback("digits", "vboard")
    actions = [h["action"] for h in reg.history("digits", "vboard")]
    assert actions == ["promoted"] * 3 + ["rollback from v0004", "rollback from v0003"]
    assert reg.current("digits", "vboard").info["files_sha256"]["model.onnx"]


def test_a_version_s_files_are_verified_against_what_was_recorded(tmp_path):
    reg = Registry(tmp_path / "registry")
    model, priors = tmp_path / "m.onnx", tmp_path / "priors.npy"
    model.write_bytes(b"model")
    priors.write_bytes(b"priors")
    reg.record("digits", "vboard", model, {"accuracy": 0.5}, _decision(), extras={"priors.npy": priors})
    version = reg.version("digits", "vboard", "v0001")
    files = version.verified_files(("model.onnx", "model.int8.onnx", "priors.npy"))
    assert sorted(files) == ["model.onnx", "priors.npy"]  # only what the version holds
    assert files["priors.npy"][1] == version.info["files_sha256"]["priors.npy"]
    (version.path / "priors.npy").write_bytes(b"edited")  # what a rollout would send is refused
    with pytest.raises(RegistryError, match=r"priors\.npy: sha256 .* differs .* recorded with v0001"):
        version.verified_files(("model.onnx", "priors.npy"))
    with pytest.raises(RegistryError, match="no version 'v0009'"):
        reg.version("digits", "vboard", "v0009")
