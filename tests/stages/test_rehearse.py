"""Validation's judging rehearsal (tasks.stages.rehearse): the probe's inference model evaluated as
the judge will on a few samples of every test set, and quantized when the recipe asks."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import ValidationFailed
from tasks.prepare.pipeline import prepare
from tasks.stages.rehearse import SAMPLES, rehearse_judging
from tests.prepare.kit import tiny_recipe


def _prepared(tmp_path, changes):
    recipe = tiny_recipe(tmp_path, changes)
    return recipe, prepare(recipe, tmp_path / "out")


def test_every_test_set_is_evaluated_and_int8_made(tmp_path):
    (tmp_path / "data").mkdir()
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((8, 1, 4, 4)).astype(np.float32))
    recipe, prep = _prepared(tmp_path, {"quantize": {"calibration": str(calib), "samples": 8},
                                        "data": {"extra_tests": {"again": "data/test.npz"}}})  # fmt: skip
    report = rehearse_judging(recipe, prep)
    assert report["samples"] == SAMPLES and set(report) == {"samples", "test", "again", "int8"}
    assert np.isfinite(report["test"]["loss"]) and report["int8"]["quantize_linear"] > 0
    assert not list(prep.out_dir.glob(".rehearse-*"))  # nothing left behind


def test_a_quantization_that_would_fail_after_training_fails_validation(tmp_path):
    (tmp_path / "data").mkdir()
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.zeros((8, 2, 4, 4), np.float32))  # two channels: the model takes one
    recipe, prep = _prepared(tmp_path, {"quantize": {"calibration": str(calib), "samples": 8}})
    with pytest.raises(
        ValidationFailed, match=r"'int8_quantization'.*quantize.calibration.*\(1, 4, 4\)"
    ) as err:
        rehearse_judging(recipe, prep)
    assert "\n" not in str(err.value)
