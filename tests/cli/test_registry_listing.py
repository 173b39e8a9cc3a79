"""``odl registry``: one readable line per version, its failing checks and its run on the lines after."""

from __future__ import annotations

from tasks.judge.decision import decide
from tasks.judge.registry import Registry
from tasks.recipe.extras import PromotionSpec
from tests.judge.test_verdict_lines import rejected_night


def test_each_version_is_a_line_under_160_characters_with_its_details_after(tmp_path, monkeypatch, capsys):
    from flows.cli import main

    monkeypatch.setenv("ODL_HOME", str(tmp_path))
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    reg = Registry(tmp_path / "registry")
    rule = PromotionSpec("accuracy", 0.0, None)
    promoted = decide({"accuracy": 0.802}, {"accuracy": 0.46}, rule, "base")
    reg.record("digits", "vb1", model, {"accuracy": 0.802}, promoted, info={"flow_run_id": "run-one"})
    rejected = rejected_night()
    reg.record("digits", "vb1", model, {"accuracy": 0.8173}, rejected, info={"flow_run_id": "run-two"})
    assert main(["registry", "digits", "vb1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 160 for line in lines), [len(line) for line in lines]
    assert lines[0].startswith("* v0001  promoted  ") and lines[0].endswith(
        "accuracy 0.8020 vs 0.4600 (base), gain +0.3420"
    )
    assert lines[1] == "      run run-one"
    assert (
        lines[2].startswith("  v0002  rejected  ")
        and "; fails: not significant (p=0.12), guardrail loss" in lines[2]
    )
    said = " ".join(" ".join(lines[3:]).split())
    for c in rejected.failing():
        assert f"FAIL {c['name']}: {' '.join(c['text'].split())}" in said
    assert lines[-1] == "      run run-two"
