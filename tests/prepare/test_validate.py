"""Offline validation: passes on the reference recipes, fails with the named check otherwise;
the digits recipe really improves shifted-domain accuracy when fine-tuned with ORT."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flows.cli import main
from tasks.errors import DataError, HostExit, ValidationFailed
from tasks.prepare.pipeline import prepare
from tasks.prepare.validation.validate import validate
from tests.prepare.kit import tiny_recipe


def test_digits_validation_report(prepared_digits):
    v = prepared_digits.validation
    assert v == json.loads(prepared_digits.validation_path.read_text())
    assert v["passed"] and v["probe_torch_loaded"] is False
    assert v["checks"]["inference_matches_torch"]["max_abs_diff"] < 1e-4
    assert v["checks"]["data_fits_model"]["train"] == {"samples": 400, "x_shape": [1, 8, 8]}
    assert v["steps_per_epoch"] == 13 and v["batch_size"] == 32
    assert 0 < v["measured_peak_rss_mb"] < v["board_peak_estimate_mb"] < 1024
    assert v["time_per_step_s"] > 0
    split = v["checks"]["split_matches_full"]  # digits trains split by default
    assert split["split_eval_loss"] == pytest.approx(split["full_eval_loss"], rel=1e-5)


def test_large_outputs_are_compared_with_a_scaled_tolerance(tmp_path):
    """A high lr makes logits huge; float32 rounding then exceeds 1e-4 in absolute terms although
    ORT and PyTorch agree (relative ~1e-7): the check scales its tolerance, it does not fail."""
    from tasks.paths import PROJECT_ROOT
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(
        PROJECT_ROOT / "recipes" / "digits.toml", {"optimizer.lr": 9.5, "trainable.batchnorm": "batch-stats"}
    )
    v = prepare(recipe, tmp_path / "out").validation
    match = v["checks"]["inference_matches_torch"]
    assert match["max_abs_diff"] > 1e-4  # what a fixed absolute tolerance used to reject
    assert match["max_abs_diff"] < 1e-4 * match["output_scale"]


def test_loss_that_cannot_fall_fails(tmp_path):
    recipe = tiny_recipe(tmp_path, {"optimizer": {"kind": "sgd", "lr": 1e-30}})
    with pytest.raises(ValidationFailed) as info:
        prepare(recipe, tmp_path / "out")
    assert info.value.check == "loss_falls"
    assert "stayed flat" in str(info.value) and "raise optimizer.lr" in str(info.value)
    report = info.value.report  # the folder is gone (a failed prepare leaves nothing)
    assert (report["passed"], report["failed_check"]) == (False, "loss_falls")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_diverging_loss_says_so(tmp_path):
    recipe = tiny_recipe(tmp_path, {"optimizer": {"kind": "sgd", "lr": 10.0}}, loss="mse")
    with pytest.raises(ValidationFailed, match="diverged.*lower optimizer.lr") as info:
        prepare(recipe, tmp_path / "out")
    assert info.value.check in ("loss_falls", "loss_finite")


def test_dropout_does_not_cry_wolf_and_the_check_is_deterministic(tmp_path):
    """Dropout makes single losses noisy; the seeded probe compares averages, the same every run."""
    recipe = tiny_recipe(tmp_path, {"model": {"callable": "tinymodels:dropout_net"}})
    first = prepare(recipe, tmp_path / "out").validation
    second = validate(recipe, tmp_path / "out")
    assert first["passed"] and first["repeat_losses"] == second["repeat_losses"]
    assert len(set(first["repeat_losses"])) == len(first["repeat_losses"])  # the steps really trained


@pytest.mark.parametrize(
    ("repeat", "outcome"),
    [
        ([2.0, 1.9, 2.1, 1.5, 1.2, 1.0], None),
        ([1e-8, 1e-8, 1e-9, 1e-8, 1e-8, 1e-9], "already ~0"),
        ([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], "stayed flat"),
        ([1.0, 1.0, 1.0, 1.1, 1.2, 1.2], r"rose \(1 -> 1.1667\): lower optimizer.lr"),  # not "flat"
        ([1.0, 1.2, 1.5, 3.0, 5.0, 9.0], "diverged"),
    ],
)
def test_loss_falls_verdicts(repeat, outcome):
    from tasks.prepare.validation.validate import check_losses

    report = {"losses": [1.0], "repeat_losses": repeat, "eval_loss": 1.0}
    if outcome in (None, "already ~0"):
        note = check_losses(report)
        assert note is None if outcome is None else outcome in note
    else:
        with pytest.raises(ValidationFailed, match=outcome):
            check_losses(report)


def test_labels_out_of_range_fail_before_export(tmp_path):
    recipe = tiny_recipe(tmp_path, {"model": {"num_classes": 2}})
    with pytest.raises(DataError, match=r"^data.train .*labels in \[0, 2\], expected \[0, 1\]") as info:
        prepare(recipe, tmp_path / "out")
    assert info.value.exit_code == HostExit.DATA and not (tmp_path / "out").exists()


def test_labels_out_of_the_models_class_range_fail_without_num_classes(tmp_path):
    """No num_classes in the recipe: the exported model's output (3 classes) sets the range, as
    on the board; the label 3 of a fourth class is refused by prepare, not after the upload."""
    recipe = tiny_recipe(tmp_path, {"model": {"num_classes": None}})
    (tmp_path / "data").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data" / "train.npz", x=rng.standard_normal((32, 1, 4, 4)).astype(np.float32),
             y=np.arange(32, dtype=np.int64) % 4)  # fmt: skip
    np.savez(tmp_path / "data" / "test.npz", x=rng.standard_normal((8, 1, 4, 4)).astype(np.float32),
             y=np.arange(8, dtype=np.int64) % 3)  # fmt: skip
    with pytest.raises(DataError, match=r"data.train .*labels in \[0, 3\], expected \[0, 2\]"):
        prepare(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_broken_artifact_fails_named_check(tmp_path):
    recipe = tiny_recipe(tmp_path)
    prepare(recipe, tmp_path / "out", validate=False)
    (tmp_path / "out" / "artifacts" / "optimizer_model.onnx").write_bytes(b"not onnx")
    with pytest.raises(ValidationFailed) as info:
        validate(recipe, tmp_path / "out")
    assert info.value.check == "load_artifacts"


def test_split_that_differs_from_the_full_graph_fails_named_check(tmp_path):
    import onnx
    from onnx import numpy_helper

    recipe = tiny_recipe(tmp_path)
    prep = prepare(recipe, tmp_path / "out", validate=False)
    assert prep.manifest["prefix_cache"]["enabled"]
    path = tmp_path / "out" / "artifacts" / "split" / "prefix.onnx"
    prefix = onnx.load(str(path))
    first = prefix.graph.initializer[0]  # a frozen weight of the prefix, changed: the split is wrong
    first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first) * 3 + 0.5, first.name))
    onnx.save(prefix, str(path))
    with pytest.raises(ValidationFailed, match=r"training\.prefix_cache = 'off'") as info:
        validate(recipe, tmp_path / "out")
    assert info.value.check == "split_matches_full"
    report = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert report["failed_check"] == "split_matches_full" and not report["passed"]


def _accuracy(path, data):
    import onnxruntime

    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return float((sess.run(None, {"input": data["x"]})[0].argmax(1) == data["y"]).mean())


def test_digits_fine_tuning_improves_shifted_accuracy(prepared_digits, digits_recipe, tmp_path):
    """The product's accuracy demo: ORT fine-tuning of the prepared artifacts on the shifted domain."""
    from onnxruntime.training import api

    art = prepared_digits.artifacts_dir
    state = api.CheckpointState.load_checkpoint(str(art / "checkpoint"))
    module = api.Module(str(art / "training_model.onnx"), state, str(art / "eval_model.onnx"))
    opt = api.Optimizer(str(art / "optimizer_model.onnx"), module)
    opt.set_learning_rate(digits_recipe.optimizer.lr)
    train, test = np.load(digits_recipe.data.train), np.load(digits_recipe.data.test)
    module.export_model_for_inferencing(str(tmp_path / "before.onnx"), ["logits"])
    rng = np.random.default_rng(0)
    for _ in range(digits_recipe.training.epochs):
        for idx in np.array_split(rng.permutation(len(train["y"])), len(train["y"]) // 32):
            module(train["x"][idx], train["y"][idx])
            opt.step()
            module.lazy_reset_grad()
    module.export_model_for_inferencing(str(tmp_path / "after.onnx"), ["logits"])
    before, after = _accuracy(tmp_path / "before.onnx", test), _accuracy(tmp_path / "after.onnx", test)
    assert before < 0.5 and after > before + 0.25, (before, after)


def test_cli_prepare_exit_codes(tmp_path, capsys):
    from tasks.paths import PROJECT_ROOT

    recipe = str(PROJECT_ROOT / "recipes" / "embedded_loss.toml")
    assert main(["prepare", recipe, "--out", str(tmp_path / "ok"), "--set", "training.batch_size=8"]) == 0
    assert "validation passed" in capsys.readouterr().out
    assert (
        main(["prepare", recipe, "--out", str(tmp_path / "bad"), "--set", "optimizer.kind=adam"])
        == HostExit.RECIPE
    )
    assert "recipe field 'optimizer.kind'" in capsys.readouterr().err
    assert (
        main(["prepare", recipe, "--out", str(tmp_path / "nl"), "--set", "optimizer.lr=1e-30"])
        == HostExit.VALIDATION
    )
    assert "validation check 'loss_falls' failed" in capsys.readouterr().err


def test_cli_stages_one_by_one(tmp_path, capsys):
    from tasks.paths import PROJECT_ROOT

    recipe, out = str(PROJECT_ROOT / "recipes" / "digits.toml"), str(tmp_path)
    assert main(["export", recipe, "--out", out]) == 0
    assert main(["artifacts", recipe, "--model", f"{out}/model.onnx", "--out", out]) == 0
    assert main(["validate", recipe, "--out", out, "--steps", "3"]) == 0
    assert json.loads((tmp_path / "validation.json").read_text())["passed"]
