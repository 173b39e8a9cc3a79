"""The report's segmentation sections: per-class IoU of every evaluated model and a few test images
with the masks drawn over them (the truth, then each model's prediction), in one fixed palette."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tasks.judge.charts import data_url, masks_chart
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
    cols = [c for c, m in evaluations.items() if m.get("examples") and "per_class_iou" in m]
    if not cols or test_path is None or not Path(test_path).is_file():
        return []
    last = evaluations[cols[-1]]
    with np.load(test_path) as data:
        if not {"x", "y"} <= set(data.files):
            return []
        x, y = data["x"], data["y"]
    ignore = int(last.get("ignore_index", 255))
    out = []
    for k, example in enumerate(last["examples"]):
        i = example["index"]
        if i >= len(x):
            continue
        panels = {"truth": subsample(y[i])}
        for c in cols:
            found = evaluations[c]["examples"]
            if k < len(found) and found[k]["index"] == i:
                panels[c] = np.asarray(found[k]["mask"])
        out.append(masks_chart(x[i], panels, last.get("classes", []), int(last.get("background", 0)), ignore))
    return out


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
