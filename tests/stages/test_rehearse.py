"""Validation's judging rehearsal (tasks.stages.rehearse): the probe's inference model evaluated as
the judge will on a few samples of every test set, and quantized when the recipe asks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tasks.errors import ValidationFailed
from tasks.judge.registry import decide
from tasks.judge.report import ReportInput, preparation_warnings, render_report, summary_text
from tasks.paths import PROJECT_ROOT
from tasks.prepare.pipeline import prepare
from tasks.recipe.extras import PromotionSpec
from tasks.recipe.load import load_recipe
from tasks.stages.rehearse import HELD_OUT, SAMPLES, rehearse_judging, sign_test
from tests.prepare.kit import tiny_recipe

DIGITS = PROJECT_ROOT / "recipes" / "digits.toml"


def _prepared(tmp_path, changes):
    recipe = tiny_recipe(tmp_path, changes)
    return recipe, prepare(recipe, tmp_path / "out")


@pytest.mark.parametrize("runtime", ["ort-training", "autograd"])
def test_every_test_set_is_evaluated_and_int8_made(tmp_path, runtime):
    """Under either runtime: the autograd runtime's inference model is its template byte-patched."""
    (tmp_path / "data").mkdir()
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((8, 1, 4, 4)).astype(np.float32))
    recipe, prep = _prepared(tmp_path, {"quantize": {"calibration": str(calib), "samples": 8},
                                        "data": {"extra_tests": {"again": "data/test.npz"}},
                                        "training": {"runtime": runtime}})  # fmt: skip
    assert prep.manifest.get("runtime", "ort-training") == runtime
    report = rehearse_judging(recipe, prep)
    assert report["samples"] == SAMPLES
    assert set(report) == {"samples", "test", "again", "int8", "held_out", "warnings"}
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


def _report_with(warnings: list[str]) -> str:
    metrics = {"accuracy": 0.5, "loss": 1.0}
    decision = decide(
        metrics, metrics, PromotionSpec(metric="accuracy", min_gain=0.0, significance=None), "base"
    )
    inp = ReportInput(recipe="digits", board="vboard", flow_run_id="fr", job_id="job", test_set="test.npz",
                      evaluations={"base": metrics, "candidate": metrics}, decision=decision, version="v0001",
                      warnings=warnings)  # fmt: skip
    return render_report(inp) + summary_text(inp)


def test_a_rate_that_diverges_on_held_out_data_is_one_warning_line(tmp_path, capsys):
    """digits at lr 10 (the schema's bound): the probe's checks pass, but its training takes the
    held-out loss from ~3 to hundreds on most samples; `odl prepare` says so in one line naming
    optimizer.lr and the schedule, prepares anyway, and the run report carries the warning."""
    from flows.cli import main

    out = tmp_path / "out"
    assert main(["prepare", str(DIGITS), "--set", "optimizer.lr=10", "--out", str(out)]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "optimizer.lr = 10 diverges" in line]
    assert len(lines) == 1, lines
    assert "schedule.final_lr_ratio = 0.1" in lines[0] and "lower optimizer.lr (try 1)" in lines[0]
    validation = json.loads((out / "validation.json").read_text())
    held = validation["checks"]["judging_rehearsed"]["held_out"]
    assert held["samples"] == HELD_OUT and held["loss_after"] > 10 * held["loss_before"]
    assert held["samples_worse"] > held["samples_better"] and held["sign_test_p"] < 0.05
    warned = preparation_warnings(json.loads((out / "manifest.json").read_text()), validation)
    assert warned == [held["warning"]] and held["warning"] in lines[0]
    report = _report_with(warned)
    assert "## ⚠️ Preparation warnings" in report and f"- {held['warning']}" in report
    assert f"  warning: {held['warning']}" in report


def test_the_recipes_own_rate_gets_no_warning(tmp_path):
    recipe = load_recipe(DIGITS)
    done = prepare(recipe, tmp_path / "out", rehearse=rehearse_judging)
    rehearsed = done.validation["checks"]["judging_rehearsed"]
    assert rehearsed["warnings"] == [] and "warning" not in rehearsed["held_out"]
    assert rehearsed["held_out"]["loss_after"] < rehearsed["held_out"]["loss_before"]
    assert preparation_warnings(done.manifest, done.validation) == []
    assert "Preparation warnings" not in _report_with([])


@pytest.mark.parametrize(("worse", "better", "significant"), [(52, 12, True), (12, 4, True), (11, 5, False),
                                                              (3, 0, False), (0, 0, False)])  # fmt: skip
def test_the_noise_rule_is_a_one_sided_sign_test(worse, better, significant):
    """More samples worse than better counts only beyond chance: 12 of 16 does (p 0.038), 11 of
    16 does not (p 0.105), nor 3 of 3 (p 0.125) or nothing changed."""
    assert (sign_test(worse, better) < 0.05) == significant
