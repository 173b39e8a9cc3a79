"""The fleet run's report (markdown for the Prefect UI and ``$ODL_HOME/reports``): per round, which
boards took part (and why the others did not), each board's training loss and its own update's
accuracy on the host test set, the aggregate's accuracy, bytes moved, and the promotion verdict."""

from __future__ import annotations

from typing import Any

from tasks.judge.charts import data_url, line_chart

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


def round_table(rec: dict[str, Any]) -> list[str]:
    """One round: a row per board and the aggregate's line."""
    out = [
        f"### Round {rec['round']}: {len(rec['took_part'])} of {len(rec['boards'])} boards "
        f"(quorum {rec['min_boards']})",
        "",
        "| board | status | samples | train loss | train acc (its own data) | its update on host test | up | down | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for board, row in rec["boards"].items():
        if row["status"] != "ok":
            out.append(f"| {board} | {STATUS.get(row['status'], row['status'])}: {row.get('error', '')} "
                       "| | | | | | | |")  # fmt: skip
            continue
        m = row.get("metrics", {})
        out.append(
            f"| {board} | took part | {row['samples']} | {m.get('train_loss', float('nan')):.4f} | "
            f"{_pct(m, 'train_accuracy')} | {_pct(row.get('host'))} | {_kb(row['bytes_up'])} | "
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
    return out + [""]


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


def render_fleet_report(summary: dict[str, Any], verdict: str = "", gate: list[str] | None = None) -> str:
    """The whole report: header, chart, every round, then the verdict on the final aggregate."""
    s = summary["strategy"]
    rounds = summary["rounds"]
    start = summary.get("start", {}).get("from", "base")
    lines = [
        f"# Fleet run: {summary['recipe']} on group `{summary['group']}`",
        "",
        f"Boards: {', '.join(summary['boards'])}. Strategy **{s['strategy']}** (server_lr {s['server_lr']:g}"
        f"{', momentum ' + format(s['momentum'], 'g') if s['strategy'] != 'fedavg' else ''}), "
        f"{len(rounds)} of {s['rounds']} rounds, quorum {s['min_boards']}, deadline {s['deadline_s']:g} s "
        f"per round; started from {start}.",
        "",
    ]
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
