"""The report's section on a teacher's labels (``[teacher]`` recipes): what the board captured
unlabeled, how many samples the teacher labeled and how many it dropped, its confidence histogram and
the classes it gave. Aggregates only, as the board reports them (no sample leaves the board); the
teacher's own accuracy on the host test set is the ``teacher`` column of the before/after table."""

from __future__ import annotations

from typing import Any

BAR = "█"


def teacher_md(figures: dict[str, Any], unlabeled: dict[str, Any] | None) -> list[str]:
    """Markdown lines of the section, or none when the run had no teacher."""
    if not figures:
        return []
    md = ["", "## Teacher labels (on the board)"]
    if unlabeled:
        md.append(
            f"- unlabeled on the board for this run: {unlabeled.get('samples', 0)} samples in "
            f"{len(unlabeled.get('files', []))} shard(s), {unlabeled.get('new_samples', 0)} new since the model "
            "in service learnt"
        )
    total, kept = figures.get("teacher_samples", 0), figures.get("kept", 0)
    share = f" ({kept / total:.0%})" if total else ""
    if "boxes" in figures:  # a detector teacher: images with a confident box, and the boxes
        md.append(
            f"- teacher-labeled images trained on: **{kept}** of {total}{share} (the others had no detection "
            f"scoring {figures.get('threshold', 0):g} or more); {figures['boxes']} boxes, "
            f"{figures.get('boxes_per_image', 0):g} per image, matched to the student's priors on the board"
        )
    else:
        md.append(
            f"- teacher-labeled samples trained on: **{kept}** of {total}{share}; dropped under the threshold "
            f"{figures.get('threshold', 0):g}: {figures.get('dropped_threshold', 0)}, by the per-class cap: "
            f"{figures.get('dropped_cap', 0)}; mean confidence {figures.get('mean_confidence', 0):.3f}"
        )
    md += [
        f"- labelled now: {figures.get('shards_labelled', 0)} shard(s) ({figures.get('samples', 0)} samples"
        + (f", {figures['samples_per_s']:.0f} samples/s" if figures.get("samples_per_s") else "")
        + (
            f", peak RSS {figures['teacher_peak_rss_mb']:.0f} MB"
            if figures.get("teacher_peak_rss_mb")
            else ""
        )
        + f"); stored labels reused: {figures.get('shards_reused', 0)} shard(s)",
    ]
    md += _histogram(figures.get("confidence_histogram") or {}, "boxes" in figures)
    md += _classes(figures.get("class_counts") or {})
    return md


def _histogram(hist: dict[str, Any], boxes: bool) -> list[str]:
    counts, edges = hist.get("counts") or [], hist.get("edges") or []
    if not counts or len(edges) != len(counts) + 1:
        return []
    top = max(counts) or 1
    rows = [
        f"| {edges[i]:.1f}-{edges[i + 1]:.1f} | {c} | {BAR * round(20 * c / top)} |"
        for i, c in enumerate(counts)
    ]
    what = "each detection's score" if boxes else "top-class probability"
    return ["", f"### Teacher confidence ({what})", "| bin | count | |", "|---|---|---|", *rows]


def _classes(counts: dict[str, int]) -> list[str]:
    if not counts:
        return []
    top = max(counts.values()) or 1
    rows = [
        f"| {c} | {n} | {BAR * round(20 * n / top)} |"
        for c, n in sorted(counts.items(), key=lambda kv: int(kv[0]))
    ]
    return ["", "### Classes of the kept labels (or boxes)", "| class | count | |", "|---|---|---|", *rows]
