"""The promoted metric across a recipe+board's registry versions, with the gate's verdict on each.

:func:`trend_points` turns the registry's versions (oldest first) into plain dicts, one per
recorded candidate; :func:`trend_markdown` renders them as the report's trend section (a chart
drawn by :func:`tasks.judge.charts.trend_chart` and a table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tasks.judge.charts import data_url, trend_chart
from tasks.judge.decision import shortlist
from tasks.judge.direction import LOWER_IS_BETTER
from tasks.judge.registry import Version

HEADING = "## Promoted metric across versions"
VERDICT_CHARS = 32  # the failing checks a version's row names (the table fits a 1280 px window)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def metric_label(metric: str, loss_kind: str | None = None) -> str:
    """A metric's name as the trend shows it: "loss (l1)" when the loss kind is known."""
    return f"{metric} ({loss_kind})" if metric == "loss" and loss_kind else metric


def verdict(version: Version) -> str:
    """The gate's verdict on one version in a few words: "promoted" or "rejected: <why>"."""
    if version.promoted:
        return "promoted"
    why = failing_checks(version)
    return "rejected: " + "; ".join(why) if why else "rejected"


def failing_checks(version: Version) -> list[str]:
    """The few words of each check that failed on a version ([] when promoted)."""
    if version.promoted:
        return []
    d = version.info.get("decision") or {}
    failing = [c.get("short", c.get("name", "?")) for c in d.get("checks") or [] if not c.get("holds", True)]
    if failing:  # the decision's own checks, as its reason names them
        return failing
    why = []
    gain, min_gain = _number(d.get("gain")), _number(d.get("min_gain"))
    if gain is not None and min_gain is not None and not gain > min_gain:
        why.append("gain below min_gain")
    test = d.get("significance") or {}
    if test and not test.get("significant", True):
        p = _number(test.get("p_value"))
        why.append("not significant" + (f" (p={p:.2g})" if p is not None else ""))
    why += [f"guardrail {r.get('rule', '?')}" for r in d.get("guardrails") or [] if not r.get("holds", True)]
    int8 = (version.metrics.get("int8") or {}).get("quantization") or {}
    if (int8.get("verdict") or {}).get("holds") is False:
        why.append("int8 model does not hold up")
    return why


def trend_points(versions: Sequence[Version], current_name: str | None) -> list[dict[str, Any]]:
    """One plain dict per recorded version (oldest first) whose decision names its metric.

    Each has ``name``, ``metric`` (with ``label``, "loss (l1)"), ``candidate``, ``reference``,
    ``reference_name``, ``promoted``, ``in_service`` (it is ``current_name``), ``verdict`` (and its
    ``failing`` checks' few words),
    ``p_value`` (None without a p-value), ``recorded_at`` and ``service``/``service_name``: the
    metric and name of the version in service after this record (the candidate when promoted,
    else the reference it was judged against). When the metric (or a loss's kind) changed across
    versions, only the versions judged on the latest version's metric are kept, since values of
    different metrics do not share an axis.
    """
    points = []
    for v in versions:
        d = v.info.get("decision")
        if not isinstance(d, dict):
            continue
        metric, candidate = d.get("metric"), _number(d.get("candidate"))
        if not isinstance(metric, str) or candidate is None:
            continue
        kind = v.metrics.get("loss_kind") if metric == "loss" else None
        reference, promoted = _number(d.get("reference")), v.promoted
        test = d.get("significance") or {}
        points.append({
            "name": v.name,
            "metric": metric,
            "label": metric_label(metric, kind),
            "candidate": candidate,
            "reference": reference,
            "reference_name": d.get("reference_name"),
            "promoted": promoted,
            "in_service": v.name == current_name,
            "verdict": verdict(v),
            "failing": failing_checks(v),
            "p_value": _number(test.get("p_value")),
            "recorded_at": _number(v.info.get("recorded_at")),
            "service": candidate if promoted else reference,
            "service_name": v.name if promoted else d.get("reference_name"),
        })  # fmt: skip
    if not points:
        return []
    latest = points[-1]["label"]
    return [p for p in points if p["label"] == latest]


def _cell(value: float | None) -> str:
    return f"{value:.4f}" if value is not None and math.isfinite(value) else "-"


def trend_markdown(points: Sequence[dict[str, Any]], chart: bytes | None) -> list[str]:
    """The trend section: a heading, the chart (when given) inline, and one table row per version."""
    if not points:
        return []
    label, metric = points[-1]["label"], points[-1]["metric"]
    promoted = sum(1 for p in points if p["promoted"])
    serving = next((p["name"] for p in points if p["in_service"]), None)
    better = "lower" if metric in LOWER_IS_BETTER else "higher"
    out = [
        "",
        HEADING,
        f"`{label}` ({better} is better) of {len(points)} recorded candidate{'s' * (len(points) != 1)}, "
        f"{promoted} promoted; "
        + (f"`{serving}` is in service." if serving else "none of them is in service."),
    ]
    if chart:
        out += ["", f"![{label} across versions]({data_url(chart)})"]
    out += ["", f"| version | {metric} | vs (reference) | verdict | in service |", "|---|---|---|---|---|"]
    for p in points:
        ref = (
            f"{_cell(p['reference'])} ({p['reference_name']})"
            if p["reference_name"]
            else _cell(p["reference"])
        )
        mark = "**yes**" if p["in_service"] else ""
        failing = p.get("failing") or []
        cell = f"rejected: {shortlist(failing, VERDICT_CHARS)}" if failing else p["verdict"]
        out.append(f"| {p['name']} | {_cell(p['candidate'])} | {ref} | {cell} | {mark} |")
    return out


def trend_section(points: Sequence[dict[str, Any]]) -> list[str]:
    """The report's trend section with its chart drawn ('' lines when there are no points)."""
    if not points:
        return []
    return trend_markdown(points, trend_chart(points, points[-1]["label"]))


def lineage_md(lineage: dict[str, Any]) -> list[str]:
    """Where the candidate started, the board files it trained on and where it now serves."""
    start, data, served = lineage.get("start_from"), lineage.get("board_data"), lineage.get("rollout")
    lines = []
    if start and start.get("from") not in (None, "base"):
        lines.append(f"- **Warm start** from `{start['from']}` (weights sha256 `{start['weights_sha256'][:12]}`, "
                     f"{start['parameters']} parameters)")  # fmt: skip
    elif start and lineage.get("weights"):
        lines.append(f"- **Started** from the recipe's base weights `{lineage['weights']}`")
    elif start:
        lines.append("- **Started from random features**: the recipe names no `[model] weights`, so the "
                     "frozen layers compute random features and little can be learnt on top of them; give "
                     "a local state_dict (ImageNet's, or one pretrained on your data)")  # fmt: skip
    if data:
        new, old = ", ".join(data["new"]) or "none", ", ".join(data["replayed"]) or "none"
        lines.append(f"- **Board data** `{data['path']}` ({data['select']}): {len(data['files'])} of "
                     f"{data['folder_files']} files, {data['samples']} samples; new: {new}; replayed: {old}")  # fmt: skip
    if served:
        lines.append(f"- **Serving on the board**: {served}")
    return ["", "## This run's lineage", *lines] if lines else []
