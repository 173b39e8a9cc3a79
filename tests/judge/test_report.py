"""Report rendering: markdown content, inline PNGs that decode, artifact keys, epoch tables."""

from __future__ import annotations

import base64
import io
import re
from types import SimpleNamespace

from PIL import Image

from tasks.judge.registry import decide
from tasks.judge.report import (
    ReportInput,
    compare_table,
    epoch_table,
    render_report,
    report_key,
    step_losses,
    summary_text,
)
from tasks.recipe.extras import PromotionSpec


def _metrics(acc, loss):
    return {
        "accuracy": acc,
        "loss": loss,
        "latency_ms_batch1": 0.05,
        "model_size_bytes": 4096,
        "confusion_matrix": [[5, 1], [2, 7]],
        "per_class": {"precision": [0.714, 0.875], "recall": [0.833, 0.778]},
    }


def _input(promote=True):
    base, cand = _metrics(0.46, 1.7), _metrics(0.83 if promote else 0.40, 0.6)
    decision = decide(cand, base, PromotionSpec(metric="accuracy", min_gain=0.0, significance=None), "base")
    events = [SimpleNamespace(type="step", seq=i, data={"step": i, "loss": 2.0 / (i + 1)}) for i in range(10)]
    events.append(SimpleNamespace(type="epoch", seq=10, data={"epoch": 1}))
    return ReportInput(
        recipe="digits",
        board="vboard",
        flow_run_id="fr-1",
        job_id="job-1",
        test_set="test.npz",
        evaluations={"base": base, "candidate": cand},
        decision=decision,
        version="v0003",
        extra_tests={"clean": {"base": {"accuracy": 0.97}, "candidate": {"accuracy": 0.93}}},
        history=[
            {"epoch": 1, "train_loss": 1.2, "eval_loss": 1.1},
            {"epoch": 2, "train_loss": 0.7, "eval_loss": 0.8},
        ],
        step_losses=step_losses(events),
        training={"steps": 10, "duration_s": 1.5},
        timings={"export": 1.0, "train on vboard": 2.5},
    )


def test_report_has_table_decision_and_decodable_images():
    md = render_report(_input())
    assert "**Promoted**" in md and "`v0003`" in md
    assert "| accuracy | 0.4600 | 0.8300 |" in md
    assert "| model size (KiB) | 4.0 | 4.0 |" in md
    assert "### Extra test set `clean`" in md and "| accuracy | 0.9700 | 0.9300 |" in md
    assert "| **total** | 3.50 |" in md
    images = re.findall(r"!\[([^\]]+)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", md)
    assert [name for name, _ in images] == ["loss per step", "loss per epoch", "confusion matrix"]
    for _, b64 in images:
        img = Image.open(io.BytesIO(base64.b64decode(b64)))
        assert img.format == "PNG" and img.width > 200 and len(set(img.getdata())) > 3


def test_rejected_report_says_why():
    inp = _input(promote=False)
    md = render_report(inp)
    assert "**Not promoted**" in md and "current` unchanged" in md and "does not beat" in md
    assert "not promoted" in summary_text(inp)


def test_loss_rows_name_the_loss_kind():
    cols = {"base": {"loss": 0.9, "loss_kind": "l1"}, "candidate": {"loss": 0.4, "loss_kind": "l1"}}
    assert "| loss (l1) | 0.9000 | 0.4000 |" in compare_table(cols)
    assert "| loss | 0.9000 |" in compare_table({"base": {"loss": 0.9}})
    inp = _input()
    inp.evaluations = {col: {**m, "loss_kind": "cross-entropy"} for col, m in inp.evaluations.items()}
    assert "| loss (cross-entropy) | 1.7000 | 0.6000 |" in render_report(inp)
    assert "loss=0.6000  (loss: cross-entropy)" in summary_text(inp)


def test_keys_and_tables():
    assert report_key("Digits_V2", "vboard") == "odl-report-digits-v2-vboard"
    assert re.fullmatch(r"[a-z0-9-]+", report_key("a__b", "B.1", "epochs"))
    rows = epoch_table([{"train_loss": 0.123456789, "epoch": 1}])
    assert rows == [{"epoch": 1, "train_loss": 0.123457}]
    assert step_losses([SimpleNamespace(type="step", seq=3, data={"loss": float("nan")})]) == []


def test_the_gate_table_lists_every_check_failing_first_and_flags_drops():
    from tasks.judge.decision import Decision
    from tasks.judge.report_gate import gate_md

    checks = [
        {"kind": "min_gain", "name": "min_gain", "holds": True, "text": "map50 0.0069 vs 0.0029"},
        {
            "kind": "significance",
            "name": "significance",
            "holds": False,
            "text": "interval [-0.0008, +0.0155]",
        },
        {
            "kind": "guardrail",
            "name": "guardrail clean.map50",
            "holds": True,
            "drop": True,
            "text": "0.5 -> 0.49",
        },
    ]
    sig = {"test": "paired bootstrap", "low": -0.0008, "high": 0.0155, "per_class": {"square": [-0.01, 0.02]}}
    d = Decision(False, "map50", 0.0069, 0.0029, "v0001", 0.004, 0.0, "r", sig, [], checks)
    md = "\n".join(gate_md(d))
    rows = [line for line in md.splitlines() if line.startswith("| ") and "gate check" not in line]
    assert rows[0].startswith("| significance | 🔴 **fails** |")
    assert rows[2].startswith("| guardrail clean.map50 | 🟡 holds (within tolerance), but drops |")
    assert "Per-class AP gain, same bootstrap resamples of the test images: square [-0.0100, +0.0200]." in md


def test_the_report_links_the_boards_events_when_a_ui_runs():
    inp = _input()
    assert "events around this run" not in render_report(inp)  # a temporary server: no UI to link
    inp.events_url = "http://127.0.0.1:4200/events?resource=odl.board.vboard&type=around"
    second = render_report(inp).splitlines()[1]
    assert (
        second
        == f"flow run `fr-1`, board job `job-1`; [the board's events around this run]({inp.events_url})"
    )


def test_report_names_the_boards_machine_and_onnxruntime():
    from dataclasses import replace

    from tasks.prefect.publish import board_versions

    result = {"versions": {"machine": "aarch64", "onnxruntime": "1.19.2", "python": "3.11.2"}}
    md = render_report(replace(_input(), training={"steps": 10} | board_versions(result)))
    assert "steps: 10, board machine: aarch64, onnxruntime: 1.19.2" in md
    assert board_versions({"versions": {}}) == board_versions({}) == {}  # an agent that sent none
