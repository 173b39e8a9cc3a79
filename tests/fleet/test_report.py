"""The fleet report's trust figures (tasks.fleet.report) and the boards' overview lines
(tasks.prefect.fleet.mark_boards): outliers first with the rule, per-board norm, cosine and flag,
the privacy spent per round and for the run, an early stop, each overview line short."""

from __future__ import annotations

import dataclasses

from tasks.fleet.outliers import RULE
from tasks.fleet.report import render_fleet_report
from tasks.recipe.extras import FleetSpec

PRIVACY = {"mode": "central", "clip": 0.5, "noise_multiplier": 1.0, "delta": 1e-5, "target_epsilon": 8.0}


def _row(norm: float, cos: float, why: dict[str, str] | None = None) -> dict:
    why = why or {}
    return {"status": "ok", "samples": 50, "metrics": {"train_loss": 1.0}, "host": {"accuracy": 0.5},
            "bytes_up": 40000, "bytes_down": 41000, "seconds": 3.0,
            "update": {"norm": norm, "cos_aggregate": cos, "cos_median": cos, "outlier": bool(why),
                       "kinds": list(why), "why": list(why.values())}}  # fmt: skip


def _summary() -> dict:
    bad = {"norm": "norm 4.67 > 3 MADs above the median 0.5", "left out": "left out by the strategy"}
    rounds = [
        {"round": r, "min_boards": 2, "took_part": ["a", "b", "c"], "samples": 150, "bytes_up": 1, "bytes_down": 1,
         "tensor_bytes": 1, "host_seconds": 0.1, "aggregate": {"accuracy": 0.4, "loss": 1.5, "samples": 197},
         "boards": {"a": _row(0.4, 0.9), "b": _row(0.5, 0.8), "c": _row(4.67, -1.0, bad)}, "outliers": ["c"],
         "privacy": {**PRIVACY, "epsilon": eps}, "noise": {"clipped": 1, "updates": 3, "noise_std_of_mean": 0.167}}
        for r, eps in ((1, 4.73), (2, 7.08))
    ]  # fmt: skip
    spec = dataclasses.asdict(FleetSpec(strategy="fedavg", rounds=4))
    stopped = (
        "round 3 was not run: it would bring ε to 9.01, past target_epsilon 8 (δ 1e-05); 2 rounds run, ε 7.08"
    )
    return {"recipe": "digits_fleet", "group": "trio", "boards": ["a", "b", "c"], "run_id": "x", "strategy": spec,
            "start": {"from": "base"}, "rounds": rounds, "stopped": stopped,
            "privacy": {**PRIVACY, "epsilon": 7.08, "rounds": 2, "stopped": stopped}}  # fmt: skip


def test_the_report_leads_with_the_outliers_and_states_the_privacy_spent():
    md = render_fleet_report(_summary())
    head = md[: md.index("### Round 1")]
    assert f"**Outlying boards**: c (rule: {RULE})." in head and "- c: round 1: norm 4.67" in head
    assert (
        "**Differential privacy**: ε = 7.08 for δ = 1e-05 (central DP, clip 0.5, noise multiplier 1; " in head
    )
    assert "after 2 rounds, per board" in head and "**Stopped early**: round 3 was not run" in head
    assert "| c | took part | 50 | 1.0000 | – | 0.5000 | 4.67 | -1.00 | **yes**: norm 4.67" in md
    assert "| a | took part | 50 | 1.0000 | – | 0.5000 | 0.4 | 0.90 | no |" in md
    assert (
        "Privacy after this round: ε = 4.73" in md
        and "1 of 3 updates clipped, noise std 0.167 on the mean" in md
    )


def test_a_run_without_outliers_says_so_with_the_rule():
    s = _summary()
    for rec in s["rounds"]:
        rec["boards"]["c"] = _row(0.45, 0.7)
        rec["outliers"] = []
    assert f"No board's update was an outlier (rule: {RULE})." in render_fleet_report(s)


def test_the_overview_gets_short_lines_per_board(tmp_path, monkeypatch):
    import json

    from tasks.judge.registry import Registry
    from tasks.prefect import fleet as ft
    from tasks.prefect.boards import overview_rows

    monkeypatch.setenv("ODL_HOME", str(tmp_path))
    ft.mark_boards(_summary())
    seen = {b: json.loads((tmp_path / "boards-seen" / f"{b}.json").read_text())["fleet"] for b in "ac"}
    assert seen == {"a": ["fleet r2: ok"], "c": ["fleet r2: OUTLIER", "norm, left out"]}
    rows = {r["board"]: r for r in overview_rows(["a", "c"], Registry(tmp_path / "registry"))}
    assert rows["c"]["trained"].split("<br>")[1:] == ["fleet r2: OUTLIER", "norm, left out"]
    assert (
        max(len(line) for line in ["fleet r2: OUTLIER", "norm, direction, left out"]) <= 25
    )  # the UI's cells
