"""The report's segmentation sections: per-class IoU of every evaluated model and a few test images
with the masks drawn over them (the truth, then each model's prediction), in one fixed palette."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.judge.charts import data_url, masks_chart
from tasks.judge.report_examples import example_panels
from tasks.judge.segmentation import subsample


def per_class_iou_table(evaluations: dict[str, dict[str, Any]]) -> str:
    """Per-class IoU of every evaluated segmentation (rows: classes; '' when none is one)."""
    cols = [c for c, m in evaluations.items() if m.get("per_class_iou")]
    if not cols:
        return ""
    classes = list(evaluations[cols[-1]]["per_class_iou"])
    lines = ["| class | " + " | ".join(f"IoU {c}" for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for name in classes:
        cells = [evaluations[c]["per_class_iou"].get(name) for c in cols]
        lines.append(f"| {name} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in cells) + " |")
    return "\n".join(lines)


def example_images(evaluations: dict[str, dict[str, Any]], test_path: Path | None) -> list[bytes]:
    """Test images with the truth and each model's predicted mask drawn (empty without them)."""
    last, shown = example_panels(evaluations, test_path, "per_class_iou", "mask", subsample)
    ignore, background = int(last.get("ignore_index", 255)), int(last.get("background", 0))
    return [
        masks_chart(image, panels, last.get("classes", []), background, ignore) for image, panels in shown
    ]


def segmentation_md(evaluations: dict[str, dict[str, Any]], test_path: Path | None) -> list[str]:
    """The segmentation's sections: per-class IoU, drawn test images."""
    table = per_class_iou_table(evaluations)
    if not table:
        return []
    md = ["", "## Segmentation: per-class IoU on the test set", table]
    images = example_images(evaluations, test_path)
    if images:
        md += [
            "",
            "### Test images (left to right: the truth, then each model's mask; white: ignored pixels)",
        ]
        md += [f"![test masks {k}]({data_url(png)})" for k, png in enumerate(images)]
    return md
