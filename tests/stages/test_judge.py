"""The judging stages score every model with the recipe's own loss: an ``l1`` recipe is evaluated and
promoted on its l1 loss (not the mse), an embedded-loss recipe on its eval graph's loss."""

from __future__ import annotations

import math

import pytest

from tasks import stages
from tasks.judge.losses import eval_graph_loss
from tasks.judge.registry import Decision, Registry
from tasks.judge.runtime import npz_arrays
from tests.fixtures_prepare import RECIPES
from tests.judge.kit import train_a_few_steps
from tests.prepare.kit import tiny_recipe

BOARD = "vboard"


def _registry_with_current(root, recipe, model) -> Registry:
    """A registry whose current version for ``recipe`` on :data:`BOARD` is ``model``."""
    reg = Registry(root)
    forced = Decision(True, "loss", 0.0, 1.0, "base", 1.0, 0.0, "seeded by the test")
    reg.record(recipe.name, BOARD, model, {}, forced)
    return reg


def test_l1_recipe_is_evaluated_and_promoted_on_its_l1_loss(tmp_path, monkeypatch):
    from tasks.prepare.pipeline import prepare

    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    changes = {"promotion": {"metric": "loss"}, "data": {"extra_tests": {"train_set": "data/train.npz"}}}
    recipe = tiny_recipe(tmp_path, changes, loss="l1")
    prep = prepare(recipe, tmp_path / "prepared", validate=False)
    candidate = tmp_path / "trained.onnx"
    train_a_few_steps(prep, recipe, candidate)
    reg = _registry_with_current(tmp_path / "registry", recipe, stages.base_model(prep))
    reference = stages.choose_reference(recipe.name, BOARD, reg)
    assert reference.name == "v0001"

    ev = stages.evaluate(recipe, prep, candidate, reference)
    assert set(ev.sets) == {"test", "train_set"}
    for columns in ev.sets.values():
        assert set(columns) == {"base", "current", "candidate"}
        for m in columns.values():
            assert m["loss_kind"] == "l1" and m["loss"] == m["mae"]
    assert ev.test["candidate"]["loss"] != pytest.approx(ev.test["candidate"]["mse"], rel=1e-3)

    promotion = stages.promote(recipe, BOARD, ev, candidate, prep, {}, reg)
    decision = promotion.decision
    assert decision.candidate == ev.test["candidate"]["mae"]
    assert decision.reference == ev.test["current"]["mae"]  # the current version re-scored on l1
    assert "min_gain: loss (l1) " in decision.reason
    assert reg.versions(recipe.name, BOARD)[-1].metrics["loss_kind"] == "l1"


def test_embedded_recipe_is_evaluated_on_its_eval_graph_loss(prepared_embedded, tmp_path, monkeypatch):
    from tasks.recipe.load import load_recipe

    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    recipe = load_recipe(RECIPES / "embedded_loss.toml")
    candidate = tmp_path / "trained.onnx"
    board_eval_loss = train_a_few_steps(prepared_embedded, recipe, candidate)

    ev = stages.evaluate(recipe, prepared_embedded, candidate, stages.Reference("base"))
    assert set(ev.test) == {"base", "candidate"}
    assert all(m["loss_kind"] == "embedded" and math.isfinite(m["loss"]) for m in ev.test.values())
    cand = ev.test["candidate"]
    assert cand["loss"] == pytest.approx(board_eval_loss, rel=1e-5)
    arrays = npz_arrays(recipe.data.test, ["x", "y"])
    feeds = {name: arrays[key] for name, key in prepared_embedded.manifest["feeds"].items()}
    eval_model = prepared_embedded.artifacts_dir / "eval_model.onnx"
    assert cand["loss"] == pytest.approx(eval_graph_loss(eval_model, candidate, feeds), rel=1e-6)
    assert ev.test["base"]["loss"] != pytest.approx(cand["loss"], rel=1e-3)

    decision = stages.promote(
        recipe, BOARD, ev, candidate, prepared_embedded, {}, Registry(tmp_path / "registry")
    ).decision
    assert (
        "ok min_gain: loss (embedded) " in decision.reason
        and "ok significance: paired bootstrap" in decision.reason
        and decision.candidate == cand["loss"]
    )


def test_an_int8_model_that_does_not_hold_up_blocks_promotion(tmp_path, monkeypatch):
    """[quantize] max_drop: the float candidate earns its promotion, but an int8 model whose accuracy
    falls further than max_drop keeps it from being promoted, with both reasons; within max_drop
    it is promoted and the int8 model is stored beside the float one."""
    from tasks.prepare.pipeline import prepare

    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    quantize = {"calibration": "data/train.npz", "samples": 16, "max_drop": 0.5}
    # the float candidate earns its promotion whatever a few steps on the tiny set do
    promotion = {"min_gain": -1.0, "significance": False}
    recipe = tiny_recipe(tmp_path, {"quantize": quantize, "promotion": promotion})
    prep = prepare(recipe, tmp_path / "prepared", validate=False)
    candidate = tmp_path / "run" / "inference.onnx"
    candidate.parent.mkdir()
    train_a_few_steps(prep, recipe, candidate)
    ev = stages.evaluate(recipe, prep, candidate, stages.Reference("base"))
    assert set(ev.test) == {"base", "candidate", "candidate int8"} and ev.int8["quantize_linear"] > 0
    verdict = ev.int8["verdict"]
    assert verdict["metric"] == "accuracy" and verdict["holds"]
    reg = Registry(tmp_path / "registry")
    promoted = stages.promote(recipe, BOARD, ev, candidate, prep, {}, reg)
    assert promoted.decision.promote
    assert (reg.versions(recipe.name, BOARD)[-1].path / "model.int8.onnx").is_file()
    failing = {**verdict, "holds": False, "reason": "int8 accuracy 0.1 is 0.5 below the float model's"}
    blocked = stages.promote(recipe, BOARD, stages.Evaluation(ev.reference, ev.sets, {**ev.int8, "verdict": failing}),
                             candidate, prep, {}, reg)  # fmt: skip
    assert not blocked.decision.promote
    assert "beats" in blocked.decision.reason and blocked.decision.reason.startswith(
        "FAIL int8 model: int8 accuracy 0.1"
    )
