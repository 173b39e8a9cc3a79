"""The report's keypoints sections: each keypoint's PCK and mean error for every evaluated model, and a
few test images with the keypoints drawn (the truth, then each model's), one colour per keypoint."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from tasks.judge.charts import MASK_PALETTE, data_url, png_bytes, rgb_array, text_font
from tasks.judge.report_examples import example_panels


def per_keypoint_table(evaluations: dict[str, dict[str, Any]]) -> str:
    """PCK and mean error (input pixels) per keypoint of every evaluated model ('' when none judges keypoints)."""
    cols = [c for c, m in evaluations.items() if m.get("per_keypoint")]
    if not cols:
        return ""
    names = list(evaluations[cols[-1]]["per_keypoint"])
    head = " | ".join(f"PCK {c} | error px {c}" for c in cols)
    lines = [f"| keypoint | {head} |", "|---|" + "---|---|" * len(cols)]
    for name in names:
        cells = []
        for c in cols:
            kp = evaluations[c]["per_keypoint"].get(name)
            cells += ["-", "-"] if kp is None else [f"{kp['pck']:.3f}", f"{kp['error_px']:.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def keypoints_chart(image: np.ndarray, panels: dict[str, np.ndarray], names: Sequence[str],
                    side: int = 160) -> bytes:  # fmt: skip
    """One test image (``[C, H, W]``) drawn once per panel (title -> ``[K, 2+]`` keypoints in input
    pixels; a third column 0 hides a keypoint), keypoint k a disc in MASK_PALETTE[k], a legend under
    them (wrapped to the panels' width)."""
    h, w = image.shape[-2:]
    base = Image.fromarray(rgb_array(image)).resize((side, side), Image.Resampling.BILINEAR)
    pad, title = 8, 22
    width = len(panels) * (side + pad) + pad
    legend = _legend_rows(names, width - 2 * pad)
    out = Image.new("RGB", (width, side + title + 6 + 18 * len(legend) + pad), "white")
    draw = ImageDraw.Draw(out)
    for i, (name, points) in enumerate(panels.items()):
        x0 = pad + i * (side + pad)
        out.paste(base, (x0, title))
        for k, p in enumerate(np.asarray(points, np.float64)):
            if len(p) > 2 and p[2] <= 0:
                continue
            cx, cy = x0 + p[0] * side / w, title + p[1] * side / h
            draw.ellipse(
                [cx - 4, cy - 4, cx + 4, cy + 4], fill=MASK_PALETTE[k % len(MASK_PALETTE)], outline="white"
            )
        draw.text((x0 + side // 2, 4), name, fill="black", font=text_font(13), anchor="ma")
    for row, items in enumerate(legend):
        y = title + side + 6 + 18 * row
        for k, x in items:
            draw.ellipse([pad + x, y, pad + x + 12, y + 12], fill=MASK_PALETTE[k % len(MASK_PALETTE)])
            draw.text((pad + x + 16, y), names[k], fill="black", font=text_font(12))
    return png_bytes(out)


def _legend_rows(names: Sequence[str], width: int) -> list[list[tuple[int, int]]]:
    """The legend's rows of (keypoint, x offset), each row at most ``width`` pixels wide."""
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    rows: list[list[tuple[int, int]]] = [[]]
    x = 0
    for k, name in enumerate(names):
        size = 28 + int(measure.textlength(name, font=text_font(12)))
        if rows[-1] and x + size - 12 > width:
            rows.append([])
            x = 0
        rows[-1].append((k, x))
        x += size
    return rows


def example_images(evaluations: dict[str, dict[str, Any]], test_path: Path | None) -> list[bytes]:
    """Test images with the true and each model's keypoints drawn (empty without them)."""
    last, shown = example_panels(evaluations, test_path, "per_keypoint", "keypoints")
    return [keypoints_chart(image, panels, last.get("keypoint_names", [])) for image, panels in shown]


def keypoints_md(evaluations: dict[str, dict[str, Any]], test_path: Path | None) -> list[str]:
    """The keypoints' sections: per-keypoint PCK and error, drawn test images."""
    table = per_keypoint_table(evaluations)
    if not table:
        return []
    md = ["", "## Keypoints: PCK and mean error per keypoint on the test set", table]
    images = example_images(evaluations, test_path)
    if images:
        md += ["", "### Test images (left to right: the truth, then each model's keypoints)"]
        md += [f"![test keypoints {k}]({data_url(png)})" for k, png in enumerate(images)]
    return md
