"""The report's words (issue 46): a count of one is singular, a gain of zero says what it means (and
that identical scores are the same model again), a guardrail that holds is never marked red."""

from __future__ import annotations

from tasks.judge.decision import Decision, decide, headline
from tasks.judge.report_gate import gate_md
from tasks.judge.trend import trend_markdown
from tasks.recipe.extras import PromotionSpec

RULE = PromotionSpec(metric="accuracy", min_gain=0.0, significance=None)


def _point(name: str) -> dict:
    return {"name": name, "label": "accuracy", "metric": "accuracy", "value": 0.8, "promoted": True,
            "in_service": True, "candidate": 0.8, "reference": 0.5, "reference_name": "base", "verdict": "promoted"}  # fmt: skip


def test_one_recorded_candidate_is_singular() -> None:
    md = "\n".join(trend_markdown([_point("v0001")], None))
    assert "of 1 recorded candidate, 1 promoted;" in md
    md = "\n".join(trend_markdown([_point("v0001"), _point("v0002")], None))
    assert "of 2 recorded candidates, 2 promoted;" in md


def test_identical_scores_say_the_same_model_was_trained_again() -> None:
    scores = {"accuracy": 0.9, "loss": 0.3, "latency_ms_batch1": 0.05}
    d = decide(scores, {**scores, "latency_ms_batch1": 0.07}, RULE, "v0001")
    assert not d.promote and "does not beat the required +0.0000" not in d.reason
    assert "no gain: the candidate scores exactly as v0001 on every metric" in d.reason
    assert "same data and recipe" in d.reason and "same model" in headline(d)


def test_a_zero_gain_with_other_scores_says_no_gain() -> None:
    d = decide({"accuracy": 0.9, "loss": 0.2}, {"accuracy": 0.9, "loss": 0.3}, RULE, "v0001")
    assert "no gain over v0001 (the same figure); promotion needs a gain above +0.0000" in d.reason
    assert "same model" not in d.reason
    d = decide({"accuracy": 0.9, "loss": 0.2}, {"accuracy": 0.91, "loss": 0.3}, RULE, "v0001")
    assert "gain -0.0100 does not beat the required +0.0000" in d.reason


def test_a_guardrail_that_holds_is_not_marked_red() -> None:
    checks = [
        {"kind": "min_gain", "name": "min_gain", "holds": True, "text": "gain"},
        {"kind": "guardrail", "name": "guardrail loss", "holds": True, "drop": True, "text": "0.5 -> 0.51"},
        {"kind": "guardrail", "name": "guardrail clean", "holds": False, "text": "0.9 -> 0.5"},
    ]
    d = Decision(False, "accuracy", 0.9, 0.8, "v0001", 0.1, 0.0, "r", None, [], checks)
    rows = {line.split(" | ")[0][2:]: line for line in gate_md(d) if line.startswith("| guardrail")}
    assert (
        "🔴" not in rows["guardrail loss"] and "holds (within tolerance), but drops" in rows["guardrail loss"]
    )
    assert "🔴 **fails**" in rows["guardrail clean"]
