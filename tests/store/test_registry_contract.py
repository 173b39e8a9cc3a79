"""The registry's contract, run against both backends: the local folder (the embedded default) and
the shared store on a real PostgreSQL (a private cluster, a database per test)."""

from __future__ import annotations

import math

import pytest

from tasks.errors import RegistryError
from tasks.judge.registry import Registry
from tasks.judge.registry_open import open_registry
from tests.store.kit import model_file, verdict


@pytest.fixture(params=["local", "shared"])
def reg(request, tmp_path):
    if request.param == "local":
        return Registry(tmp_path / "registry")
    request.getfixturevalue("shared_store")
    return open_registry(tmp_path / "home")


def test_promote_then_reject_keeps_current_and_every_version(reg, tmp_path):
    assert reg.current("digits", "vboard") is None and reg.versions("digits", "vboard") == []
    v1 = reg.record("digits", "vboard", model_file(tmp_path, b"model-1"), {"accuracy": 0.8}, verdict(True, 0.8),
                    info={"flow_run_id": "run-1"})  # fmt: skip
    assert v1.name == "v0001" and v1.promoted and reg.current("digits", "vboard").name == "v0001"
    v2 = reg.record("digits", "vboard", model_file(tmp_path, b"model-2"), {"accuracy": 0.7}, verdict(False, 0.7),
                    info={"flow_run_id": "run-2"})  # fmt: skip
    assert v2.name == "v0002" and not v2.promoted and v2.info["reason"].startswith("FAIL")
    current = reg.current("digits", "vboard")
    assert current.name == "v0001" and current.model.read_bytes() == b"model-1"
    assert current.metrics == {"accuracy": 0.8} and current.info["flow_run_id"] == "run-1"
    assert [v.name for v in reg.versions("digits", "vboard")] == ["v0001", "v0002"]
    assert reg.version("digits", "vboard", "v0002").model.read_bytes() == b"model-2"
    assert [c["action"] for c in reg.history("digits", "vboard")] == ["promoted"]
    assert reg.versions("digits", "other") == [] and reg.current("other", "vboard") is None
    reg.record("teacher", "vboard", model_file(tmp_path, b"t"), {"accuracy": 0.5}, verdict(False, 0.5))
    # the recipes of a board: the fleet overview's rows (tasks/prefect/boards.py)
    assert reg.recipes("vboard") == ["digits", "teacher"] and reg.recipes("other") == []


def test_rollback_walks_back_the_versions_in_service(reg, tmp_path):
    with pytest.raises(RegistryError, match=r"nothing to roll back to \(no version in service\)"):
        reg.rollback("r", "b")
    for i, promote in enumerate([True, False, True, True]):
        reg.record("r", "b", model_file(tmp_path, f"m{i}".encode()), {"accuracy": i}, verdict(promote, i))
    assert reg.current("r", "b").name == "v0004" and reg.previous("r", "b").name == "v0003"
    assert reg.rollback("r", "b").name == "v0003"
    assert reg.current("r", "b").name == "v0003" and reg.current("r", "b").model.read_bytes() == b"m2"
    assert reg.rollback("r", "b").name == "v0001"
    with pytest.raises(RegistryError, match=r"nothing to roll back to \(v0001 is the first promoted\)"):
        reg.rollback("r", "b")
    actions = [(c["version"], c["action"]) for c in reg.history("r", "b")]
    assert actions == [("v0001", "promoted"), ("v0003", "promoted"), ("v0004", "promoted"),
                       ("v0003", "rollback from v0004"), ("v0001", "rollback from v0003")]  # fmt: skip


def test_side_files_and_manifest_are_kept_and_verified(reg, tmp_path):
    priors = model_file(tmp_path, b"priors", "priors.npy")
    manifest = model_file(tmp_path, b'{"recipe": "det"}', "manifest.json")
    v = reg.record("det", "b", model_file(tmp_path, b"detector"), {"accuracy": 1.0}, verdict(True),
                   manifest=manifest, extras={"priors.npy": priors})  # fmt: skip
    assert set(v.info["files_sha256"]) == {"model.onnx", "priors.npy"}  # the JSON files are not hashed
    got = reg.current("det", "b").verified_files(("model.onnx", "priors.npy", "model.int8.onnx"))
    assert set(got) == {"model.onnx", "priors.npy"}
    assert {n: sha for n, (_, sha) in got.items()} == v.info["files_sha256"]
    assert (reg.current("det", "b").path / "manifest.json").read_bytes() == b'{"recipe": "det"}'


def test_a_metric_may_be_nan_and_comes_back_as_nan(reg, tmp_path):
    reg.record("r", "b", model_file(tmp_path, b"m"), {"accuracy": 0.1, "loss": float("nan")}, verdict(False))
    assert math.isnan(reg.version("r", "b", "v0001").metrics["loss"])


def test_names_are_checked_and_an_unknown_version_refused(reg):
    with pytest.raises(RegistryError, match="board name: '../x' is not a valid name"):
        reg.versions("digits", "../x")
    with pytest.raises(RegistryError, match="recipe name"):
        reg.current("Digits", "b")
    for name in ("v0009", "latest", "v"):
        with pytest.raises(RegistryError, match=f"no version '{name}' in the registry"):
            reg.version("digits", "b", name)
