"""Registry: promote, reject, atomic current, nothing lost."""

from __future__ import annotations

import json

import pytest

from tasks.errors import RegistryError
from tasks.judge.registry import Registry, decide
from tasks.recipe.extras import PromotionSpec


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "cand.onnx"
    path.write_bytes(b"model-bytes-1")
    return path


def test_decide_higher_and_lower_is_better():
    rule = PromotionSpec(significance=None, metric="accuracy", min_gain=0.01)
    assert decide({"accuracy": 0.80}, {"accuracy": 0.70}, rule, "base").promote
    d = decide({"accuracy": 0.705}, {"accuracy": 0.70}, rule, "base")
    assert not d.promote and d.gain == pytest.approx(0.005) and "does not beat" in d.reason
    loss_rule = PromotionSpec(significance=None, metric="loss", min_gain=0.0)
    assert decide({"loss": 0.3}, {"loss": 0.5}, loss_rule, "v0001").promote
    assert not decide({"loss": 0.6}, {"loss": 0.5}, loss_rule, "v0001").promote
    assert not decide({"loss": 0.5}, {"loss": 0.5}, loss_rule, "v0001").promote  # equal is not a gain


def test_decide_on_loss_names_its_kind_and_refuses_mixed_kinds():
    rule = PromotionSpec(significance=None, metric="loss", min_gain=0.0)
    d = decide({"loss": 0.3, "loss_kind": "l1"}, {"loss": 0.5, "loss_kind": "l1"}, rule, "v0001")
    assert (
        d.promote
        and d.metric == "loss"
        and d.reason.startswith("ok min_gain: loss (l1) 0.3000 vs 0.5000 (v0001)")
    )
    assert decide({"loss": 0.3}, {"loss": 0.5}, rule, "base").reason.startswith("ok min_gain: loss 0.3000")
    with pytest.raises(RegistryError, match="the candidate's loss is l1 but v0001's is mse"):
        decide({"loss": 0.3, "loss_kind": "l1"}, {"loss": 0.5, "loss_kind": "mse"}, rule, "v0001")
    acc = PromotionSpec(significance=None, metric="accuracy")
    assert decide({"accuracy": 0.9, "loss_kind": "l1"}, {"accuracy": 0.8, "loss_kind": "mse"}, acc, "base")


def test_decide_names_a_missing_metric():
    with pytest.raises(RegistryError, match="promotion.metric 'f1'"):
        decide({"accuracy": 0.8}, {"accuracy": 0.7}, PromotionSpec(significance=None, metric="f1"), "base")


def test_promote_then_reject_keeps_current_and_everything(tmp_path, model):
    reg = Registry(tmp_path / "reg")
    assert reg.current("digits", "vboard") is None
    rule = PromotionSpec(significance=None, metric="accuracy", min_gain=0.0)
    d1 = decide({"accuracy": 0.8}, {"accuracy": 0.5}, rule, "base")
    v1 = reg.record("digits", "vboard", model, {"accuracy": 0.8}, d1, info={"flow_run_id": "run-1"})
    assert v1.name == "v0001" and v1.promoted
    assert reg.current("digits", "vboard").name == "v0001"

    model.write_bytes(b"model-bytes-2")
    d2 = decide({"accuracy": 0.79}, reg.current("digits", "vboard").metrics, rule, "v0001")
    v2 = reg.record("digits", "vboard", model, {"accuracy": 0.79}, d2, info={"flow_run_id": "run-2"})
    assert v2.name == "v0002" and not v2.promoted and "does not beat" in v2.info["reason"]
    cur = reg.current("digits", "vboard")
    assert cur.name == "v0001" and cur.model.read_bytes() == b"model-bytes-1"
    assert [v.name for v in reg.versions("digits", "vboard")] == ["v0001", "v0002"]
    assert v2.model.read_bytes() == b"model-bytes-2"
    assert json.loads((v2.path / "info.json").read_text())["flow_run_id"] == "run-2"
    entry = reg.entry("digits", "vboard")
    assert sorted(p.name for p in entry.iterdir()) == [
        "current",
        "history.jsonl",
        "v0001",
        "v0002",
    ]  # no temp leftovers


def test_a_version_is_never_overwritten(tmp_path, model):
    reg = Registry(tmp_path)
    rule = PromotionSpec(significance=None)
    for i in range(3):
        reg.record("r", "b", model, {"accuracy": i}, decide({"accuracy": i}, {"accuracy": -1}, rule, "base"))
    (reg.entry("r", "b") / "v0005").mkdir()  # a stray folder claimed by someone else
    (reg.entry("r", "b") / "v0005" / "x").write_text("keep")
    v = reg.record("r", "b", model, {"accuracy": 9}, decide({"accuracy": 9}, {"accuracy": 0}, rule, "base"))
    assert v.name == "v0006" and (reg.entry("r", "b") / "v0005" / "x").read_text() == "keep"
    assert reg.current("r", "b").name == "v0006"


def test_bad_names_and_broken_pointer(tmp_path, model):
    reg = Registry(tmp_path)
    with pytest.raises(RegistryError, match="board name: '../x' is not a valid name"):
        reg.entry("digits", "../x")
    for board in ("under_score", "x" * 21):  # the inventory's one rule, not the recipe names' rule
        with pytest.raises(RegistryError, match="is not a valid name: 1-20 characters of a-z 0-9 -"):
            reg.entry("digits", board)
    with pytest.raises(RegistryError, match="recipe name"):
        reg.entry("Digits", "b")
    reg.entry("d", "b").mkdir(parents=True)
    (reg.entry("d", "b") / "current").write_text("v0042\n")
    with pytest.raises(RegistryError, match="not a recorded version"):
        reg.current("d", "b")
