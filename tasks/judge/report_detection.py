"""The report's detection sections: per-class AP of every column, the precision-recall plot at
IoU 0.5 and test images with the ground truth and each model's detections drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tasks.judge.charts import data_url, detections_chart, line_chart


def per_class_ap_table(evaluations: dict[str, dict[str, Any]]) -> str:
    """Per-class AP@0.5 and AP@[.5:.95] of every evaluated detector ('' when none is one)."""
    cols = [c for c, m in evaluations.items() if m.get("per_class_ap50")]
    if not cols:
        return ""
    classes = list(evaluations[cols[-1]]["per_class_ap50"])
    head = [f"AP@0.5 {c}" for c in cols] + [f"AP@[.5:.95] {c}" for c in cols]
    lines = ["| class | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]

    def cell(col: str, key: str, name: str) -> str:
        val = evaluations[col].get(key, {}).get(name)
        return "-" if val is None else f"{val:.3f}"

    for name in classes:
        vals = [cell(c, "per_class_ap50", name) for c in cols] + [cell(c, "per_class_ap", name) for c in cols]
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def pr_chart(evaluations: dict[str, dict[str, Any]]) -> bytes | None:
    """Precision-recall curves at IoU 0.5, one line per class of the first and last column."""
    cols = [c for c, m in evaluations.items() if m.get("pr50")]
    if not cols:
        return None
    series: dict[str, list[tuple[float, float]]] = {}
    for col in dict.fromkeys([cols[0], cols[-1]]):
        pr = evaluations[col]["pr50"]
        for name, precision in pr.items():
            if name != "recall":
                series[f"{col}: {name}"] = list(zip(pr["recall"], precision, strict=True))
    return line_chart(series, "precision-recall at IoU 0.5 (test set)", "recall", "precision")


def example_images(evaluations: dict[str, dict[str, Any]], test_path: Path | None) -> list[bytes]:
    """Test images with the ground truth and each model's detections drawn (empty without them)."""
    cols = [c for c, m in evaluations.items() if m.get("examples") is not None]
    if not cols or test_path is None or not Path(test_path).is_file():
        return []
    with np.load(test_path) as data:
        if not {"x", "gt_boxes", "gt_labels"} <= set(data.files):
            return []
        x, gt_boxes, gt_labels = data["x"], data["gt_boxes"], data["gt_labels"]
    classes = evaluations[cols[-1]].get("classes") or []
    out = []
    for k, example in enumerate(evaluations[cols[-1]]["examples"]):
        i = example["index"]
        keep = gt_labels[i] >= 0
        panels = {c: evaluations[c]["examples"][k] for c in cols if k < len(evaluations[c]["examples"])}
        out.append(
            detections_chart(x[i], (gt_boxes[i][keep].tolist(), gt_labels[i][keep].tolist()), panels, classes)
        )
    return out


def detection_md(evaluations: dict[str, dict[str, Any]], test_path: Path | None) -> list[str]:
    """The detector's sections: per-class AP, the precision-recall plot, drawn test images."""
    table = per_class_ap_table(evaluations)
    if not table:
        return []
    md = ["", "## Detection: per-class AP (COCO evaluation, pycocotools)", table]
    png = pr_chart(evaluations)
    if png:
        md += ["", f"![precision-recall]({data_url(png)})"]
    images = example_images(evaluations, test_path)
    if images:
        md += [
            "",
            "### Test images (dashed white: ground truth; coloured: the best detections with score >= 0.1)",
        ]
        md += [f"![test image {k}]({data_url(png)})" for k, png in enumerate(images)]
    return md
