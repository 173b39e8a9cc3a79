"""The promotion gate's part of a report: every check of the decision as a table of figures (cells
short enough for a 1280 px window) with each check's sentence under it."""

from __future__ import annotations

from tasks.judge.registry import Decision

CELL_CHARS = 44  # the gate table's figures: the report fits a 1280 px wide window


def gate_md(d: Decision) -> list[str]:
    """The promotion gate: every check of the decision, failing first, as the headline names them:
    a table of their figures (cells of at most CELL_CHARS), then each check's sentence under it.

    A guarded test set that drops within its tolerance holds and is flagged amber (red is for a
    check that fails), and a gain judged without a test says so."""
    ordered = d.failing() + [c for c in d.checks if c["holds"]]
    if not ordered:  # a decision recorded before the checks list
        return []
    rows = []
    for c in ordered:
        if not c["holds"]:
            mark = "🔴 **fails**"
        elif c.get("drop"):
            mark = "🟡 holds (within tolerance), but drops"
        elif c["kind"] == "significance" and not c.get("tested", True):
            mark = "⚠️ not tested"
        else:
            mark = "holds"
        rows.append(f"| {c['name']} | {mark} | {_cell(c.get('figures') or c['text'])} |")
    out = ["", "| gate check | verdict | figures |", "|---|---|---|", *rows, ""]
    out += [f"- **{c['name']}**: {c['text']}" for c in ordered]  # the sentences, under the table
    per_class = (d.significance or {}).get("per_class")
    if per_class:  # a detector's AP or a segmentation's IoU per class, on the same resamples of the images
        cells = ", ".join(f"{name} [{lo:+.4f}, {hi:+.4f}]" for name, (lo, hi) in per_class.items())
        what = "IoU" if d.metric in ("miou", "pixel_accuracy") else "AP"
        out += ["", f"Per-class {what} gain, same bootstrap resamples of the test images: {cells}."]
    return out


def _cell(text: str) -> str:
    """A table cell of at most CELL_CHARS characters ("see below" for a longer text, whose sentence
    follows the table); a ``|`` would end the cell."""
    return text.replace("|", "/") if len(text) <= CELL_CHARS else "see below"
