"""The run report: markdown with a before/after table, loss curves and confusion matrix as inline PNGs.

Pure functions: they take the evaluation metrics, the promotion decision, the board's job result
and events, and return markdown / table rows; the Prefect tasks publish them as artifacts keyed by
:func:`report_key` so every run of one recipe+board lines up as versions of one artifact.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.judge.charts import confusion_chart, data_url, line_chart
from tasks.judge.continual import continual_md
from tasks.judge.decision import details, headline
from tasks.judge.registry import Decision
from tasks.judge.report_detection import detection_md
from tasks.judge.report_gate import gate_md
from tasks.judge.report_keypoints import keypoints_md
from tasks.judge.report_segmentation import segmentation_md
from tasks.judge.report_teacher import teacher_md
from tasks.judge.trend import lineage_md, trend_section

HEADLINE = [
    ("accuracy", "accuracy", "{:.4f}"),
    ("map50", "mAP@0.5", "{:.4f}"),
    ("map", "mAP@[.5:.95]", "{:.4f}"),
    ("map75", "mAP@0.75", "{:.4f}"),
    ("miou", "mIoU", "{:.4f}"),
    ("object_miou", "mIoU of the object classes", "{:.4f}"),
    ("pixel_accuracy", "pixel accuracy", "{:.4f}"),
    ("oks_ap", "OKS AP@[.5:.95]", "{:.4f}"),
    ("oks_ap50", "OKS AP@0.5", "{:.4f}"),
    ("oks_ap75", "OKS AP@0.75", "{:.4f}"),
    ("pck", "PCK", "{:.4f}"),
    ("loss", "loss", "{:.4f}"),
    ("mse", "mse", "{:.4f}"),
    ("mae", "mae", "{:.4f}"),
    ("latency_ms_batch1", "host latency, 1 sample (ms)", "{:.3f}"),
    ("latency_ms_per_sample", "host latency, batched (ms/sample)", "{:.4f}"),
    ("model_size_bytes", "model size (KiB)", None),
]


@dataclass
class ReportInput:
    """Everything one run's report shows."""

    recipe: str
    board: str
    flow_run_id: str
    job_id: str
    test_set: str
    evaluations: dict[str, dict[str, Any]]  # column name -> metrics on the main test set
    decision: Decision
    version: str  # registry version the candidate was recorded as
    extra_tests: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=dict
    )  # set -> column -> metrics
    history: list[dict[str, Any]] = field(default_factory=list)  # per-epoch rows from the board
    step_losses: list[tuple[float, float]] = field(default_factory=list)  # (step, loss) from events
    training: dict[str, Any] = field(default_factory=dict)  # steps, epochs, durations, peak RSS
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    test_path: Path | None = None  # the test set file (a detector's example images are drawn from it)
    int8: dict[str, Any] | None = None  # the quantized candidate (tasks.judge.quantize), with its verdict
    trend: list[dict[str, Any]] = field(default_factory=list)  # tasks.judge.trend.trend_points
    lineage: dict[str, Any] = field(default_factory=dict)  # start_from, board_data, rollout
    continual: list[dict[str, Any]] = field(default_factory=list)  # tasks.judge.continual.night_rows
    teacher: dict[str, Any] = field(default_factory=dict)  # the board's teacher figures (result.teacher)
    warnings: list[str] = field(default_factory=list)  # preparation's (preparation_warnings)
    events_url: str = ""  # the UI's event feed filtered to the board, around the run ("": no UI)


def preparation_warnings(manifest: dict[str, Any], validation: dict[str, Any] | None) -> list[str]:
    """What preparing the job warned about, one line each: the artifacts' (``manifest.json``
    ``warnings``) and validation's judging rehearsal's (a learning rate that diverges on held-out data)."""
    rehearsal = ((validation or {}).get("checks") or {}).get("judging_rehearsed")
    found = rehearsal.get("warnings", []) if isinstance(rehearsal, dict) else []
    return [*manifest.get("warnings", []), *found]


def report_key(recipe: str, board: str, kind: str = "report") -> str:
    """An artifact key for a recipe+board (lowercase letters, digits and dashes only)."""
    key = re.sub(r"[^a-z0-9-]+", "-", f"odl-{kind}-{recipe}-{board}".lower())
    return re.sub(r"-{2,}", "-", key).strip("-")


def step_losses(events: Iterable[Any]) -> list[tuple[float, float]]:
    """(step, loss) points from the board's ``step`` events (objects with ``type`` and ``data``)."""
    points = []
    for ev in events:
        data = getattr(ev, "data", None) or {}
        loss = data.get("loss", data.get("train_loss"))
        if getattr(ev, "type", "") == "step" and isinstance(loss, (int, float)) and math.isfinite(loss):
            points.append((float(data.get("step", getattr(ev, "seq", len(points)))), float(loss)))
    return points


def epoch_series(history: Sequence[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """One (epoch, value) series per loss-like column of the per-epoch history."""
    series: dict[str, list[tuple[float, float]]] = {}
    for i, row in enumerate(history):
        epoch = float(row.get("epoch", i + 1))
        for key, val in row.items():
            if "loss" in key and isinstance(val, (int, float)):
                series.setdefault(key, []).append((epoch, float(val)))
    return series


def epoch_table(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-epoch rows for a Prefect table artifact (numbers rounded, ``epoch`` first)."""
    rows = []
    for i, row in enumerate(history):
        out: dict[str, Any] = {"epoch": row.get("epoch", i + 1)}
        for key, val in row.items():
            if key != "epoch":
                out[key] = round(val, 6) if isinstance(val, float) else val
        rows.append(out)
    return rows


def _fmt(metrics: dict[str, Any], key: str, pattern: str | None) -> str:
    val = metrics.get(key)
    if not isinstance(val, (int, float)):
        return "-"
    return f"{val / 1024:.1f}" if key == "model_size_bytes" else pattern.format(val)  # type: ignore[union-attr]


def loss_label(metrics: Iterable[dict[str, Any]]) -> str:
    """The loss row's label, naming the kind the metrics give in ``loss_kind``: "loss (l1)"."""
    kinds = sorted({m["loss_kind"] for m in metrics if m.get("loss_kind")})
    return f"loss ({', '.join(kinds)})" if kinds else "loss"


def compare_table(evaluations: dict[str, dict[str, Any]]) -> str:
    """A markdown table with one row per headline metric and one column per evaluated model."""
    cols = list(evaluations)
    lines = ["| metric | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for key, label, pattern in HEADLINE:
        if any(key in m for m in evaluations.values()):
            label = loss_label(evaluations.values()) if key == "loss" else label
            lines.append(
                f"| {label} | " + " | ".join(_fmt(evaluations[c], key, pattern) for c in cols) + " |"
            )
    if any("latency_ms_batch1" in m for m in evaluations.values()):
        lines += ["", "Host latency: measured on this machine's CPU, not on the board."]
    return "\n".join(lines)


def per_class_table(metrics: dict[str, Any]) -> str:
    """Per-class precision/recall of one model as a markdown table ('' when not a classifier)."""
    pc = metrics.get("per_class")
    if not pc:
        return ""
    lines = ["| class | precision | recall |", "|---|---|---|"]
    for i, (p, r) in enumerate(zip(pc["precision"], pc["recall"], strict=True)):
        lines.append(f"| {i} | {p:.3f} | {r:.3f} |")
    return "\n".join(lines)


def _int8_md(inp: ReportInput) -> list[str]:
    """The int8 model for the NPU: how it was made, its size and whether it holds up."""
    q = inp.int8
    if not q:
        return []
    verdict = q.get("verdict", {})
    holds = verdict.get("holds")
    mark = "holds up" if holds else "does **not** hold up"
    return [
        "",
        "## int8 model for the NPU (static QDQ, batch 1)",
        f"{q.get('method')} calibration on {q.get('samples')} samples, "
        f"{'per-channel' if q.get('per_channel') else 'per-tensor'} weights, "
        f"{q.get('quantize_linear')} QuantizeLinear / {q.get('dequantize_linear')} DequantizeLinear nodes; "
        f"size {q.get('float_size_bytes', 0) / 1024:.1f} KiB float -> {q.get('size_bytes', 0) / 1024:.1f} KiB int8 "
        f"(the `{INT8_COLUMN}` column above).",
        "",
        f"The int8 model {mark}: {verdict.get('reason', '')}.",
    ]


INT8_COLUMN = "candidate int8"


def _warnings_md(inp: ReportInput) -> list[str]:
    """Preparation's warnings, one bullet each ([] when none)."""
    if not inp.warnings:
        return []
    return ["", "## ⚠️ Preparation warnings", *(f"- {line}" for line in inp.warnings)]


def _decision_md(inp: ReportInput) -> str:
    d = inp.decision
    if d.promote:
        return f"**Promoted**: recorded as `{inp.version}`, now `current`: {headline(d)}."
    return f"**Not promoted**: recorded as `{inp.version}` (rejected), `current` unchanged: {headline(d)}."


TRAINING_LABELS = {
    "steps": "steps",
    "epochs_done": "epochs",
    "duration_s": "time on the board (s)",
    "train_loop_s": "of it in the training loop (s)",
    "peak_rss_mb": "peak memory of the job (MB)",
}


def _training_md(inp: ReportInput) -> list[str]:
    t = inp.training
    parts = [
        f"{TRAINING_LABELS.get(k, k.replace('_', ' '))}: {v:.2f}" if isinstance(v, float)
        else f"{TRAINING_LABELS.get(k, k.replace('_', ' '))}: {v}"
        for k, v in t.items()
    ]  # fmt: skip
    out = ["## Training on the board", ", ".join(parts) if parts else "(no job result)"]
    if inp.step_losses:
        png = line_chart(
            {"train loss": inp.step_losses}, "training loss per step (board events)", "step", "loss"
        )
        out.append(f"![loss per step]({data_url(png)})")
    if epoch_series(inp.history):
        png = line_chart(epoch_series(inp.history), "loss per epoch", "epoch", "loss")
        out.append(f"![loss per epoch]({data_url(png)})")
    return out


def render_report(inp: ReportInput) -> str:
    """The markdown report of one run (images inline as data: URLs)."""
    md = [
        f"# ODL run: `{inp.recipe}` on `{inp.board}`",
        f"flow run `{inp.flow_run_id}`, board job `{inp.job_id}`"
        + (f"; [the board's events around this run]({inp.events_url})" if inp.events_url else ""),
        "",
        _decision_md(inp),
        *_warnings_md(inp),
        *gate_md(inp.decision),
        *lineage_md(inp.lineage),
        *trend_section(inp.trend),
        *continual_md(inp.continual),
        "",
        f"## Before / after on the host test set `{inp.test_set}`",
        compare_table(inp.evaluations),
    ]
    for name, cols in inp.extra_tests.items():
        md += ["", f"### Extra test set `{name}`", compare_table(cols)]
    md += teacher_md(inp.teacher, (inp.lineage.get("board_data") or {}).get("unlabeled"))
    md += detection_md(inp.evaluations, inp.test_path)
    md += segmentation_md(inp.evaluations, inp.test_path)
    md += keypoints_md(inp.evaluations, inp.test_path)
    md += _int8_md(inp)
    md += [""] + _training_md(inp)
    candidate = inp.evaluations.get("candidate", {})
    if candidate.get("confusion_matrix"):
        png = confusion_chart(candidate["confusion_matrix"], f"confusion matrix, candidate, {inp.test_set}",
                              candidate.get("classes"))  # fmt: skip
        md += [
            "",
            "## Candidate on the test set",
            f"![confusion matrix]({data_url(png)})",
            "",
            per_class_table(candidate),
        ]
    if inp.timings:
        md += ["", "## Time per stage", "| stage | seconds |", "|---|---|"]
        md += [f"| {k} | {v:.2f} |" for k, v in inp.timings.items()]
        md.append(f"| **total** | {sum(inp.timings.values()):.2f} |")
    return "\n".join(md) + "\n"


def summary_text(inp: ReportInput) -> str:
    """A few plain lines for a terminal: before/after headline metrics and the decision."""
    lines = [
        f"{inp.recipe} on {inp.board}: {'PROMOTED' if inp.decision.promote else 'not promoted'} "
        f"({inp.version}); {headline(inp.decision)}",
        *details(inp.decision),
    ]
    lines += [f"  warning: {line}" for line in inp.warnings]
    for col, m in inp.evaluations.items():
        keys = ("accuracy", "map50", "map", "miou", "pixel_accuracy", "oks_ap", "pck", "loss", "mse")
        line = f"  {col:<16} " + "  ".join(f"{k}={m[k]:.4f}" for k in keys if k in m)
        lines.append(f"{line}  (loss: {m['loss_kind']})" if "loss" in m and "loss_kind" in m else line)
    for name, cols in inp.extra_tests.items():
        for col, m in cols.items():
            if "accuracy" in m:
                lines.append(f"  {name}/{col:<10} accuracy={m['accuracy']:.4f}")
    if inp.timings:
        lines.append(
            "  stages: "
            + ", ".join(f"{k} {v:.1f}s" for k, v in inp.timings.items())
            + f"; total {sum(inp.timings.values()):.1f}s"
        )
    return "\n".join(lines)
