"""The fleet run's report (markdown for the Prefect UI and ``$ODL_HOME/reports``): per round, which
boards took part (and why the others did not), each board's training loss and its own update's
accuracy on the host test set, its update's norm and cosine to the aggregate's update and whether it
is an outlier (:mod:`tasks.fleet.outliers`), the aggregate's accuracy, the privacy spent, bytes
moved, and the promotion verdict."""

from __future__ import annotations

from typing import Any

from tasks.fleet.outliers import RULE
from tasks.judge.charts import data_url, line_chart

ROBUST = {"trimmed_mean": ("trim_fraction",), "krum": ("byzantine", "krum_select"), "bulyan": ("byzantine",)}

STATUS = {
    "ok": "took part",
    "late": "**cut at the deadline**",
    "failed": "**failed**",
    "rejected": "**rejected**",
}


def _pct(m: dict[str, Any] | None, key: str = "accuracy") -> str:
    return f"{m[key]:.4f}" if m and isinstance(m.get(key), int | float) else "–"


def _kb(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def buffer_table(rec: dict[str, Any]) -> list[str]:
    """One aggregation of the buffered mode: the boards that arrived (the global version each
    started from, its staleness and weight), the others' state, and the aggregate's line."""
    out = [
        f"### Aggregation {rec['round']} (version {rec['round']}): {len(rec['arrivals'])} arrivals "
        f"(buffer {rec['buffer_size']}) at {rec.get('elapsed_s', 0):.1f} s",
        "",
        "| board | status | from version | staleness | weight | samples | train loss | its update on host test "
        "| update norm | cos to aggregate | outlier | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for board, row in rec["boards"].items():
        if row["status"] == "training":
            out.append(
                f"| {board} | still training (from version {row['base_version']}) | | | | | | | | | | |"
            )
        elif row["status"] != "ok":
            out.append(f"| {board} | {STATUS.get(row['status'], row['status'])}: {row.get('error', '')} "
                       "| | | | | | | | | | |")  # fmt: skip
        else:
            m = row.get("metrics", {})
            out.append(
                f"| {board} | arrived | {row['base_version']} | {row['staleness']} | {row['weight']:.3f} | "
                f"{row['samples']} | {m.get('train_loss', float('nan')):.4f} | {_pct(row.get('host'))} | "
                f"{_update_cells(row.get('update'))} | {row['seconds']:.1f} |"
            )
    agg = rec.get("aggregate")
    if agg is None:
        return out + ["", "**No aggregate: the buffer could not be filled.**", ""]
    out += [
        "",
        f"**Aggregate** of {rec['samples']} samples: accuracy **{_pct(agg)}**, loss {_pct(agg, 'loss')}.",
    ]
    if rec.get("outliers"):
        out += ["", f"**Outliers this aggregation**: {', '.join(rec['outliers'])}."]
    return out + [""]


def round_table(rec: dict[str, Any]) -> list[str]:
    """One round: a row per board and the aggregate's line."""
    if rec.get("mode") == "buffered":
        return buffer_table(rec)
    out = [
        f"### Round {rec['round']}: {len(rec['took_part'])} of {len(rec['boards'])} boards "
        f"(quorum {rec['min_boards']})",
        "",
        "| board | status | samples | train loss | train acc (its own data) | its update on host test "
        "| update norm | cos to aggregate | outlier | up | down | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for board, row in rec["boards"].items():
        if row["status"] != "ok":
            out.append(f"| {board} | {STATUS.get(row['status'], row['status'])}: {row.get('error', '')} "
                       "| | | | | | | | | | |")  # fmt: skip
            continue
        m = row.get("metrics", {})
        out.append(
            f"| {board} | took part | {row['samples']} | {m.get('train_loss', float('nan')):.4f} | "
            f"{_pct(m, 'train_accuracy')} | {_pct(row.get('host'))} | {_update_cells(row.get('update'))} | "
            f"{_kb(row['bytes_up'])} | "
            f"{_kb(row['bytes_down'])} | {row['seconds']:.1f} |"
        )
    agg = rec.get("aggregate")
    if agg is None:
        out += ["", "**No aggregate: the quorum was not reached.**"]
    else:
        out += [
            "",
            f"**Aggregate** of {rec['samples']} samples: accuracy **{_pct(agg)}**, loss {_pct(agg, 'loss')} "
            f"on the host test set ({agg.get('samples', '?')} samples). Bytes this round: "
            f"{_kb(rec['bytes_up'])} up (trained tensors only: {_kb(rec['tensor_bytes'])} per board), "
            f"{_kb(rec['bytes_down'])} down; host work {rec.get('host_seconds', 0):.1f} s.",
        ]
        if rec.get("outliers"):
            out += ["", f"**Outliers this round**: {', '.join(rec['outliers'])}."]
        if rec.get("privacy"):
            out += [
                "",
                f"Privacy after this round: {privacy_line(rec['privacy'])}{_noise(rec.get('noise'))}.",
            ]
    return out + [""]


def _update_cells(u: dict[str, Any] | None) -> str:
    """Norm, cosine to the aggregate's update and the outlier flag with its reasons."""
    if not u:
        return "– | – | –"
    cos = "–" if u.get("cos_aggregate") is None else f"{u['cos_aggregate']:.2f}"
    flag = "**yes**: " + "; ".join(u["why"]) if u.get("outlier") else "no"
    return f"{u['norm']:.3g} | {cos} | {flag}"


def _noise(noise: dict[str, Any] | None) -> str:
    if not noise:
        return ""
    return f"; {noise['clipped']} of {noise['updates']} updates clipped, noise std {noise['noise_std_of_mean']:.3g} on the mean"


def privacy_line(p: dict[str, Any]) -> str:
    """One line of a run's (or round's) privacy: ε for δ, the settings and the target."""
    return (
        f"ε = {p['epsilon']:.3g} for δ = {p['delta']:g} ({p['mode']} DP, clip {p['clip']:g}, noise multiplier "
        f"{p['noise_multiplier']:g}; target ε {p['target_epsilon']:g})"
    )


def outlier_summary(summary: dict[str, Any]) -> list[str]:
    """The boards flagged in any round, with the rounds and the reasons; the rule."""
    flagged: dict[str, list[str]] = {}
    for rec in summary["rounds"]:
        for board, row in rec["boards"].items():
            u = row.get("update") or {}
            if u.get("outlier"):
                flagged.setdefault(board, []).append(f"round {rec['round']}: {'; '.join(u['why'])}")
    if not flagged:
        return [f"No board's update was an outlier (rule: {RULE}).", ""]
    lines = [f"**Outlying boards**: {', '.join(sorted(flagged))} (rule: {RULE}).", ""]
    return lines + [f"- {b}: {' / '.join(why)}" for b, why in sorted(flagged.items())] + [""]


def accuracy_chart(summary: dict[str, Any]) -> bytes:
    """Accuracy on the host test set per round: the aggregate and each board's own update."""
    series: dict[str, list[tuple[float, float]]] = {"aggregate": []}
    for rec in summary["rounds"]:
        if rec.get("aggregate"):
            series["aggregate"].append((rec["round"], rec["aggregate"]["accuracy"]))
        for board, row in rec["boards"].items():
            if row["status"] == "ok" and row.get("host"):
                series.setdefault(board, []).append((rec["round"], row["host"]["accuracy"]))
    return line_chart(series, "Accuracy on the host test set", "round", "accuracy")


def _settings(s: dict[str, Any]) -> str:
    """The strategy's own settings: server_lr, momentum where it is used, a robust one's knobs."""
    parts = [f"server_lr {s['server_lr']:g}"]
    if s["strategy"] in ("fedavgm", "fedadam"):
        parts.append(f"momentum {s['momentum']:g}")
    parts += [f"{k} {s[k]:g}" for k in ROBUST.get(s["strategy"], ())]
    return ", ".join(parts)


def render_fleet_report(summary: dict[str, Any], verdict: str = "", gate: list[str] | None = None) -> str:
    """The whole report: header, chart, every round, then the verdict on the final aggregate."""
    s = summary["strategy"]
    rounds = summary["rounds"]
    start = summary.get("start", {}).get("from", "base")
    lines = [
        f"# Fleet run: {summary['recipe']} on group `{summary['group']}`",
        "",
        f"Boards: {', '.join(summary['boards'])}. Strategy **{s['strategy']}** ({_settings(s)}), "
        f"{len(rounds)} of {s['rounds']} rounds, quorum {s['min_boards']}, deadline {s['deadline_s']:g} s "
        f"per round; started from {start}.",
        "",
    ]
    if s.get("mode") == "buffered":
        lines[2] = (
            f"Boards: {', '.join(summary['boards'])}. **Buffered asynchronous** (FedBuff): every board trains "
            f"from the newest global model; every {s['buffer_size']} arrivals make the next version, each "
            f"update weighted by (1 + staleness)^-{s['staleness_exponent']:g} (staleness: the global versions "
            f"made since its start). Strategy **{s['strategy']}** ({_settings(s)}), {len(rounds)} of "
            f"{s['rounds']} aggregations, deadline {s['deadline_s']:g} s per job; started from {start}."
        )
    if summary.get("privacy"):
        p = summary["privacy"]
        lines += [f"**Differential privacy**: {privacy_line(p)} after {p['rounds']} rounds, per board.", ""]
    if summary.get("stopped"):
        lines += [f"**Stopped early**: {summary['stopped']}.", ""]
    if rounds:
        lines += outlier_summary(summary)
    if verdict:
        lines += [verdict, *(gate or []), ""]
    if rounds:
        lines += [f"![accuracy per round]({data_url(accuracy_chart(summary))})", ""]
        total_up = sum(r["bytes_up"] for r in rounds)
        total_down = sum(r["bytes_down"] for r in rounds)
        lines += [f"Moved over all rounds: {_kb(total_up)} up, {_kb(total_down)} down.", ""]
    for rec in rounds:
        lines += round_table(rec)
    return "\n".join(lines)
