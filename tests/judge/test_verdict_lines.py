"""The verdict as people read it: a headline line under ~160 characters, then the failing checks'
sentences on the lines after it (the flow's state message, ``odl watch``, ``odl registry``)."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from tasks.judge.decision import (
    HEADLINE_CHARS,
    LINE_CHARS,
    Decision,
    decide,
    details,
    headline,
    shortlist,
    verdict_message,
    with_check,
)
from tasks.recipe.extras import PromotionSpec


def _classifier(correct, loss):
    return {"accuracy": float(np.mean(correct)), "loss": float(np.mean(loss)), "loss_kind": "cross-entropy",
            "per_sample": {"correct": list(correct), "loss": list(loss)}}  # fmt: skip


def rejected_night() -> Decision:
    """The nightly case that gave a 470-character line: the test, the loss guardrail, the clean
    set's default guard and the int8 model all fail."""
    ref_correct = [int(i % 5 != 0) for i in range(200)]  # 80 % right
    cand_correct = [1 if i in (0, 5, 10) else c for i, c in enumerate(ref_correct)]  # 3 more: p = 0.125
    ref_loss = np.linspace(0.1, 0.7, 200)
    cand, ref = _classifier(cand_correct, ref_loss + 0.075), _classifier(ref_correct, ref_loss)
    sets = ({"test": cand, "clean": {"accuracy": 0.835}}, {"test": ref, "clean": {"accuracy": 0.99}})
    d = decide(cand, ref, PromotionSpec("accuracy", 0.0, 0.05, {"loss": 0.05}), "v0001", sets)
    int8 = "int8 accuracy 0.7513 is 0.0609 below the float model's 0.8122, beyond quantize.max_drop 0.0200"
    return with_check(d, {"kind": "int8", "name": "int8 model", "short": "int8 model does not hold up",
                          "holds": False, "text": int8, "figures": "int8 0.7513 vs float 0.8122 (max drop 0.02)"})  # fmt: skip


def test_a_rejected_verdict_is_a_headline_then_one_sentence_per_failing_check():
    d = rejected_night()
    assert len(d.reason) > 400  # the whole story stays in the registry entry
    message = verdict_message("v0002", d)
    lines = message.splitlines()
    assert all(len(line) <= LINE_CHARS for line in lines), [len(line) for line in lines]
    assert lines[0].startswith("v0002: accuracy 0.") and len(lines[0]) <= len("v0002: ") + HEADLINE_CHARS
    assert "; fails: not significant (p=" in lines[0] and "guardrail loss" in lines[0]
    failing = [c["name"] for c in d.failing()]
    assert failing == ["significance", "guardrail loss", "guardrail clean.accuracy", "int8 model"]
    said = " ".join(" ".join(lines[1:]).split())
    for c in d.failing():  # each failing sentence, whole, in order, on the lines after the headline
        assert f"FAIL {c['name']}: {' '.join(c['text'].split())}" in said
    assert lines[1].startswith("  FAIL significance: McNemar")


def test_a_promoted_verdict_is_one_line_with_where_it_serves():
    d = decide({"accuracy": 0.953}, {"accuracy": 0.912}, PromotionSpec("accuracy", 0.0, None), "base")
    served = "; serving on vboard (models/digits/current.onnx)"
    assert verdict_message("v0003", d, served) == (
        "v0003: accuracy 0.9530 vs 0.9120 (base), gain +0.0410" + served
    )


SHORT = st.text(st.sampled_from("abcdefgh ().=-0123456789"), min_size=1, max_size=60)


@given(
    shorts=st.lists(SHORT, max_size=8),
    texts=st.lists(
        st.text(st.sampled_from("abc xyz.,()[]-+0123456789"), max_size=400), min_size=8, max_size=8
    ),
    width=st.integers(40, 200),
)
@example(shorts=["x" * 60] * 8, texts=["y" * 400] * 8, width=40)  # nothing fits: the count alone
@example(shorts=[], texts=[""] * 8, width=60)
def test_headline_and_details_fit_their_width_and_lose_nothing(shorts, texts, width):
    """Any failing checks: the headline fits ``width`` and names the failing checks (or counts the
    ones it leaves out); the details fit LINE_CHARS and hold every sentence's words, in order."""
    checks = [{"kind": "min_gain", "name": "min_gain", "holds": not shorts, "label": "accuracy", "text": "t"}]
    checks += [
        {"kind": "guardrail", "name": f"guardrail g{i}", "short": s, "holds": False, "text": texts[i]}
        for i, s in enumerate(shorts)
    ]
    d = Decision(False, "accuracy", 0.5, 0.6, "v0001", -0.1, 0.0, "r", None, [], checks)
    line = headline(d, width)
    figures = "accuracy 0.5000 vs 0.6000 (v0001), gain -0.1000"
    assert len(line) <= max(width, 0) and (figures.startswith(line) or line.startswith(figures))
    named = [c.get("short") or c["name"] for c in d.failing()]
    if len(figures) + len("; fails: ") + len(", ".join(named)) <= width:
        assert line == f"{figures}; fails: {', '.join(named)}" if named else line == figures
    lines = details(d)
    assert all(len(x) <= LINE_CHARS for x in lines)
    assert "".join("".join(lines).split()) == "".join(
        "".join(f"FAIL {c['name']}: {c['text']}".split()) for c in d.failing()
    )


@given(items=st.lists(SHORT, max_size=12), width=st.integers(16, 200))
@example(items=["x" * 60, "y"], width=16)  # not even the first fits: it is cut, the other counted
def test_a_shortlist_fits_and_counts_what_it_leaves_out(items, width):
    text = shortlist(items, width)
    assert len(text) <= width
    shown, _, more = text.rpartition(" +") if text.endswith(" more") else (text, "", "0 more")
    left_out = int(more.removesuffix(" more"))
    kept = items[: len(items) - left_out]
    if shown.endswith("…"):  # the first item, cut short
        assert len(kept) == 1 and kept[0].startswith(shown.removesuffix("…"))
    else:
        assert shown == ", ".join(kept)
