"""The promoted metric across registry versions: points, verdicts, chart and the report's section."""

from __future__ import annotations

import base64
import io
import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest
from PIL import Image

from tasks.errors import RegistryError
from tasks.judge.charts import trend_chart
from tasks.judge.registry import Registry, Version, decide
from tasks.judge.report import ReportInput, render_report
from tasks.judge.trend import HEADING, trend_markdown, trend_points
from tasks.recipe.extras import PromotionSpec

RULE = PromotionSpec(metric="accuracy", min_gain=0.0, significance=0.05)


def _run(right: list[int], n: int = 100) -> dict:
    """Metrics of a model right on the samples ``right`` of ``n``, with per-sample outcomes."""
    correct = [1 if i in set(right) else 0 for i in range(n)]
    return {"accuracy": sum(correct) / n, "per_sample": {"correct": correct}}


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    """v0001 promoted over base, v0002 rejected (gain not significant), v0003 promoted."""
    model = tmp_path / "cand.onnx"
    model.write_bytes(b"not-a-real-model")
    reg = Registry(tmp_path / "registry")
    base, v1 = _run(list(range(50))), _run(list(range(80)))
    v2, v3 = _run([*range(79), 80, 81, 82]), _run(list(range(95)))
    for cand, ref, ref_name in ((v1, base, "base"), (v2, v1, "v0001"), (v3, v1, "v0001")):
        reg.record("digits", "vboard", model, cand, decide(cand, ref, RULE, ref_name))
    return reg


def _points(reg: Registry) -> list[dict]:
    return trend_points(reg.versions("digits", "vboard"), reg.current("digits", "vboard").name)


def test_points_carry_values_verdicts_and_service(registry):
    points = _points(registry)
    assert [p["name"] for p in points] == ["v0001", "v0002", "v0003"]
    assert [p["candidate"] for p in points] == pytest.approx([0.80, 0.82, 0.95])
    assert [p["reference"] for p in points] == pytest.approx([0.50, 0.80, 0.80])
    assert [p["reference_name"] for p in points] == ["base", "v0001", "v0001"]
    assert [p["promoted"] for p in points] == [True, False, True]
    assert [p["in_service"] for p in points] == [False, False, True]
    assert [p["verdict"] for p in points] == ["promoted", "rejected: not significant (p=0.31)", "promoted"]
    assert points[1]["p_value"] == pytest.approx(5 / 16)  # McNemar: 3 wins, 1 loss, one-sided
    assert points[0]["p_value"] < 1e-6 and all(p["metric"] == "accuracy" for p in points)
    # the value in service after each record: v0002's rejection leaves v0001's in service
    assert [p["service"] for p in points] == pytest.approx([0.80, 0.80, 0.95])
    assert [p["service_name"] for p in points] == ["v0001", "v0001", "v0003"]
    assert all(isinstance(p["recorded_at"], float) for p in points)
    assert points[0]["recorded_at"] <= points[1]["recorded_at"] <= points[2]["recorded_at"]
    json.dumps(points)  # plain data, fit for a Prefect artifact


def _version(
    name: str, decision: dict | None, promoted: bool = False, metrics: dict | None = None
) -> Version:
    info = {"promoted": promoted, "reason": "", "recorded_at": 1.0}
    if decision is not None:
        info["decision"] = decision
    return Version(name, Path(name), info, metrics or {})


def test_verdicts_name_each_failed_check():
    base = {"accuracy": 0.70, "loss": 0.50}
    guarded = PromotionSpec(metric="accuracy", significance=None, guardrails={"loss": 0.01})
    worse_loss = decide({"accuracy": 0.80, "loss": 0.60}, base, guarded, "base")
    small = decide(
        {"accuracy": 0.705}, {"accuracy": 0.70}, PromotionSpec(min_gain=0.01, significance=None), "base"
    )
    both = decide({"accuracy": 0.69, "loss": 0.6}, base, guarded, "base")
    versions = [_version(f"v000{i}", asdict(d)) for i, d in enumerate((worse_loss, small, both), 1)]
    assert [p["verdict"] for p in trend_points(versions, None)] == [
        "rejected: guardrail loss",
        "rejected: gain below min_gain",
        "rejected: gain below min_gain; guardrail loss",
    ]
    assert all(p["p_value"] is None and not p["in_service"] for p in trend_points(versions, None))


def test_only_the_latest_metric_is_trended_and_undecided_versions_are_skipped():
    def d(metric, cand, ref):
        return {"metric": metric, "candidate": cand, "reference": ref, "reference_name": "base", "gain": 1.0,
                "min_gain": 0.0, "significance": None, "guardrails": []}  # fmt: skip

    versions = [
        _version("v0001", d("accuracy", 0.9, 0.5), promoted=True),
        _version("v0002", None),  # recorded before decisions were stored
        _version("v0003", d("loss", 0.3, 0.5), promoted=True, metrics={"loss_kind": "l1"}),
        _version("v0004", d("loss", 0.2, 0.3), promoted=True, metrics={"loss_kind": "mse"}),
        _version("v0005", d("loss", 0.1, 0.2), promoted=True, metrics={"loss_kind": "mse"}),
    ]
    points = trend_points(versions, "v0005")
    assert [p["name"] for p in points] == ["v0004", "v0005"]  # an l1 loss is not an mse loss
    assert points[-1]["label"] == "loss (mse)" and points[-1]["in_service"]
    assert trend_points(versions[:2], None)[0]["name"] == "v0001"
    assert trend_points([_version("v0001", None)], None) == [] and trend_markdown([], None) == []


def test_chart_is_a_png_of_sane_size(registry):
    points = _points(registry)
    png = trend_chart(points, "accuracy")
    assert png.startswith(b"\x89PNG") and 1_000 < len(png) < 200_000
    img = Image.open(io.BytesIO(png)).convert("RGB")
    assert img.size == (640, 380)
    colors = set(img.getdata())
    assert (0x2C, 0xA0, 0x2C) in colors and (0xD6, 0x27, 0x28) in colors  # promoted and rejected dots
    assert trend_chart([], "accuracy").startswith(b"\x89PNG")
    many = [dict(points[i % 3], name=f"v{i + 1:04d}") for i in range(60)]
    assert trend_chart(many, "accuracy").startswith(b"\x89PNG")


def test_report_shows_the_trend_after_the_gate(registry):
    points = _points(registry)
    cand, ref = _run(list(range(95))), _run(list(range(80)))
    inp = ReportInput(
        recipe="digits",
        board="vboard",
        flow_run_id="fr-1",
        job_id="job-1",
        test_set="test.npz",
        evaluations={"current (v0001)": ref, "candidate": cand},
        decision=decide(cand, ref, RULE, "v0001"),
        version="v0003",
        trend=points,
    )
    md = render_report(inp)
    assert md.index("| gate check |") < md.index(HEADING) < md.index("## Before / after")
    assert "`accuracy` (higher is better) of 3 recorded candidates, 2 promoted; `v0003` is in service." in md
    assert "| version | accuracy | vs (reference) | verdict | in service |" in md
    assert "| v0001 | 0.8000 | 0.5000 (base) | promoted |  |" in md
    assert "| v0002 | 0.8200 | 0.8000 (v0001) | rejected: not significant (p=0.31) |  |" in md
    assert "| v0003 | 0.9500 | 0.8000 (v0001) | promoted | **yes** |" in md
    images = re.findall(r"!\[([^\]]+)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", md)
    assert [name for name, _ in images] == ["accuracy across versions"]
    assert Image.open(io.BytesIO(base64.b64decode(images[0][1]))).format == "PNG"
    inp.trend = []
    assert HEADING not in render_report(inp)


def test_publish_reads_the_trend_from_the_registry(registry, monkeypatch):
    from tasks.prefect import publish

    monkeypatch.setattr(publish.stages, "registry", lambda: registry)
    assert [p["in_service"] for p in publish.trend("digits", "vboard")[0]] == [False, False, True]
    assert publish.trend("digits", "otherboard") == ([], [])
    (registry.entry("digits", "vboard") / "v0002" / "metrics.json").write_text("{not json")
    with pytest.raises(RegistryError, match="unreadable version"):
        publish.trend("digits", "vboard")
    (registry.entry("digits", "vboard") / "v0002" / "metrics.json").write_text("{}")
    info = registry.entry("digits", "vboard") / "v0001" / "info.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "promoted": False, "decision": {
        "metric": "accuracy", "candidate": 0.8, "significance": "garbled"}}))  # fmt: skip
    with pytest.raises(RegistryError, match="cannot read the versions"):
        publish.trend("digits", "vboard")
