"""Small PNG charts drawn with Pillow (no matplotlib): line charts, confusion matrices and test
images with detections or segmentation masks drawn.

Images are returned as PNG bytes; :func:`data_url` turns them into ``data:image/png;base64,...``
URLs that Prefect's markdown artifacts render inline.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
# segmentation masks: class k in MASK_PALETTE[k % len], the background undrawn, ignored pixels white
MASK_PALETTE = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189),
                (140, 86, 75), (227, 119, 194), (188, 189, 34), (23, 190, 207), (127, 127, 127)]  # fmt: skip
MASK_ALPHA = 0.6  # a mask's weight over its image
Series = dict[str, Sequence[tuple[float, float]]]


def data_url(png: bytes) -> str:
    """A ``data:`` URL for PNG bytes."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def png_bytes(img: Image.Image) -> bytes:
    """An image as PNG bytes."""
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def text_font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's default font at ``size`` pixels."""
    return ImageFont.load_default(size=size)


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if raw <= m * step)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int(math.ceil((hi - first) / step)) + 1)]


def line_chart(
    series: Series, title: str, xlabel: str, ylabel: str, size: tuple[int, int] = (640, 360)
) -> bytes:
    """Draw one or more (x, y) series as lines with axes, ticks and a legend; returns PNG bytes."""
    points = [p for s in series.values() for p in s if math.isfinite(p[1])]
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    w, h = size
    left, right, top, bottom = 64, w - 16, 36, h - 44
    draw.text((w // 2, 8), title, fill="black", font=text_font(15), anchor="ma")
    if not points:
        draw.text((w // 2, h // 2), "no data", fill="gray", font=text_font(14), anchor="mm")
        return png_bytes(img)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    xt, yt = _ticks(min(xs), max(xs)), _ticks(min(ys), max(ys))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def to_px(x: float, y: float) -> tuple[float, float]:
        return (left + (x - x0) / (x1 - x0) * (right - left), bottom - (y - y0) / (y1 - y0) * (bottom - top))

    small = text_font(11)
    for y in yt:
        py = to_px(x0, y)[1]
        draw.line([(left, py), (right, py)], fill="#e5e5e5")
        draw.text((left - 6, py), f"{y:g}", fill="black", font=small, anchor="rm")
    for x in xt:
        px = to_px(x, y0)[0]
        draw.text((px, bottom + 6), f"{x:g}", fill="black", font=small, anchor="ma")
    draw.rectangle([left, top, right, bottom], outline="black")
    draw.text(((left + right) // 2, h - 6), xlabel, fill="black", font=text_font(12), anchor="md")
    draw.text((8, top - 18), ylabel, fill="black", font=text_font(12))
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        pix = [to_px(x, y) for x, y in pts if math.isfinite(y)]
        if len(pix) > 1:
            draw.line(pix, fill=color, width=2)
        for px, py in pix if len(pix) <= 60 else []:
            draw.ellipse([px - 2.5, py - 2.5, px + 2.5, py + 2.5], fill=color)
        draw.text((right - 8, top + 8 + 16 * i), name, fill=color, font=text_font(12), anchor="ra")
    return png_bytes(img)


def confusion_chart(cm: Sequence[Sequence[int]], title: str, labels: Sequence[str] | None = None) -> bytes:
    """Draw a confusion matrix (rows = true class, columns = predicted) as a heat map; PNG bytes."""
    n = len(cm)
    labels = list(labels) if labels else [str(i) for i in range(n)]
    cell = max(28, min(56, 480 // max(n, 1)))
    left, top = 70, 56
    img = Image.new("RGB", (left + n * cell + 20, top + n * cell + 40), "white")
    draw = ImageDraw.Draw(img)
    draw.text((img.width // 2, 8), title, fill="black", font=text_font(15), anchor="ma")
    peak = max((max(row) for row in cm), default=0) or 1
    font = text_font(max(10, cell // 3))
    for r, row in enumerate(cm):
        for c, count in enumerate(row):
            shade = int(255 - 200 * (count / peak))
            fill = (shade, shade, 255) if r != c else (shade, 255, shade)
            box = [left + c * cell, top + r * cell, left + (c + 1) * cell, top + (r + 1) * cell]
            draw.rectangle(box, fill=fill, outline="#999999")
            if count:
                draw.text(
                    (box[0] + cell / 2, box[1] + cell / 2), str(count), fill="black", font=font, anchor="mm"
                )
        draw.text((left - 6, top + r * cell + cell / 2), labels[r], fill="black", font=text_font(12), anchor="rm")  # fmt: skip
    for c in range(n):
        draw.text((left + c * cell + cell / 2, top - 4), labels[c], fill="black", font=text_font(12), anchor="md")  # fmt: skip
    draw.text((left + n * cell / 2, top + n * cell + 8), "predicted", fill="black", font=text_font(12), anchor="ma")  # fmt: skip
    draw.text((6, top - 20), "true", fill="black", font=text_font(12))
    return png_bytes(img)


def detections_chart(
    image: np.ndarray,
    ground_truth: tuple[Sequence[Sequence[float]], Sequence[int]],
    panels: dict[str, dict[str, Sequence]],
    classes: Sequence[str],
    side: int = 288,
) -> bytes:
    """One test image drawn once per model side by side: ground truth boxes in dashed white, the
    model's detections (``panels[name]`` with ``boxes`` corners in [0, 1], ``labels``, ``scores``)
    coloured by class with their score. ``image`` is ``[3, H, W]`` in any range (stretched to
    0-255 for display). PNG bytes."""
    rgb = rgb_array(image)
    base = Image.fromarray(rgb).resize((side, side * rgb.shape[0] // rgb.shape[1]), Image.Resampling.BILINEAR)
    w, h = base.size
    pad, title = 8, 22
    out = Image.new("RGB", (len(panels) * (w + pad) + pad, h + title + pad), "white")
    font = text_font(12)
    gt_boxes, gt_labels = ground_truth
    for i, (name, dets) in enumerate(panels.items()):
        x0 = pad + i * (w + pad)
        tile = base.copy()
        draw = ImageDraw.Draw(tile)
        for box, label in zip(gt_boxes, gt_labels, strict=True):
            x1, y1, x2, y2 = (v * s for v, s in zip(box, (w, h, w, h), strict=True))
            for a, b in (
                ((x1, y1), (x2, y1)),
                ((x2, y1), (x2, y2)),
                ((x2, y2), (x1, y2)),
                ((x1, y2), (x1, y1)),
            ):
                _dashed(draw, a, b, "white")
            draw.text((x1 + 2, y2 - 13), classes[int(label)], fill="white", font=font)
        for box, label, score in zip(dets["boxes"], dets["labels"], dets["scores"], strict=True):
            color = PALETTE[int(label) % len(PALETTE)]
            x1, y1, x2, y2 = (v * s for v, s in zip(box, (w, h, w, h), strict=True))
            draw.rectangle([x1, y1, x2, y2], outline=color, width=2)
            draw.text((x1 + 2, y1 + 1), f"{classes[int(label)]} {score:.2f}", fill=color, font=font)
        out.paste(tile, (x0, title))
        draw_out = ImageDraw.Draw(out)
        draw_out.text((x0 + w // 2, 4), name, fill="black", font=text_font(13), anchor="ma")
    return png_bytes(out)


def rgb_array(image: np.ndarray) -> np.ndarray:
    """``[C, H, W]`` (1 or 3 channels, any range) as ``[H, W, 3]`` uint8, stretched to 0-255."""
    arr = np.asarray(image, np.float64)
    arr = arr[:3] if arr.shape[0] >= 3 else np.repeat(arr[:1], 3, axis=0)
    lo, hi = float(arr.min()), float(arr.max())
    return ((arr - lo) / ((hi - lo) or 1.0) * 255).astype(np.uint8).transpose(1, 2, 0)


def masks_chart(image: np.ndarray, panels: dict[str, np.ndarray], classes: Sequence[str], background: int,
                ignore_index: int, side: int = 160) -> bytes:  # fmt: skip
    """One test image (``[C, H, W]``, any range) drawn once per mask side by side, each mask
    (``panels``: title -> ``[h, w]`` class ids at any size) blended over it in MASK_PALETTE (the
    ``background`` class undrawn, ``ignore_index`` pixels white), the palette's legend under them. PNG bytes."""
    base = Image.fromarray(rgb_array(image)).resize((side, side), Image.Resampling.BILINEAR)
    pad, title = 8, 22
    out = Image.new("RGB", (len(panels) * (side + pad) + pad, side + title + 22 + pad), "white")
    draw = ImageDraw.Draw(out)
    for i, (name, mask) in enumerate(panels.items()):
        ids = Image.fromarray(np.asarray(mask, np.int32)).resize((side, side), Image.Resampling.NEAREST)
        x0 = pad + i * (side + pad)
        out.paste(
            _blend(np.asarray(base, np.float64), np.asarray(ids), background, ignore_index), (x0, title)
        )
        draw.text((x0 + side // 2, 4), name, fill="black", font=text_font(13), anchor="ma")
    x, y = pad, title + side + 6
    for k, name in enumerate(classes):
        if k != background:
            draw.rectangle([x, y, x + 12, y + 12], fill=MASK_PALETTE[k % len(MASK_PALETTE)])
            draw.text((x + 16, y), name, fill="black", font=text_font(12))
            x += 28 + int(draw.textlength(name, font=text_font(12)))
    return png_bytes(out)


def _blend(tile: np.ndarray, ids: np.ndarray, background: int, ignore_index: int) -> Image.Image:
    """Each class of ``ids`` but the background blended over ``tile`` in its MASK_PALETTE colour."""
    for cls in np.unique(ids):
        if cls != background:
            colour = (255, 255, 255) if cls == ignore_index else MASK_PALETTE[int(cls) % len(MASK_PALETTE)]
            tile[ids == cls] = (1 - MASK_ALPHA) * tile[ids == cls] + MASK_ALPHA * np.asarray(
                colour, np.float64
            )
    return Image.fromarray(tile.astype(np.uint8))


def _dashed(draw: ImageDraw.ImageDraw, a: tuple[float, float], b: tuple[float, float], color: str) -> None:
    (x1, y1), (x2, y2) = a, b
    length = math.hypot(x2 - x1, y2 - y1)
    steps = max(1, int(length // 6))
    for k in range(0, steps, 2):
        t0, t1 = k / steps, min(1.0, (k + 1) / steps)
        draw.line([(x1 + (x2 - x1) * t0, y1 + (y2 - y1) * t0), (x1 + (x2 - x1) * t1, y1 + (y2 - y1) * t1)],
                  fill=color, width=2)  # fmt: skip


def trend_chart(points: Sequence[dict], metric: str, size: tuple[int, int] = (640, 380)) -> bytes:
    """A metric across registry versions (``points`` from :func:`tasks.judge.trend.trend_points`):
    each candidate as a dot (filled green when promoted, hollow red when rejected, ringed when in
    service) over the version index, and the value in service after each record as a step line
    (the candidate when promoted, else the reference it was judged against). PNG bytes."""
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    w, h = size
    left, right, top, bottom = 64, w - 16, 56, h - 44
    draw.text((w // 2, 8), f"{metric} across versions", fill="black", font=text_font(15), anchor="ma")
    ys = [v for p in points for v in (p["candidate"], p.get("service")) if _finite(v)]
    if not ys:
        draw.text((w // 2, h // 2), "no data", fill="gray", font=text_font(14), anchor="mm")
        return png_bytes(img)
    pad = 0.08 * ((max(ys) - min(ys)) or abs(ys[0]) or 1.0)  # keep the dots off the frame
    yt, n = _ticks(min(ys) - pad, max(ys) + pad), len(points)
    y0, y1 = yt[0], yt[-1]

    def to_px(x: float, y: float) -> tuple[float, float]:
        return (left + (x + 0.5) / n * (right - left), bottom - (y - y0) / (y1 - y0) * (bottom - top))

    small = text_font(11)
    for y in yt:
        py = to_px(0, y)[1]
        draw.line([(left, py), (right, py)], fill="#e5e5e5")
        draw.text((left - 6, py), f"{y:g}", fill="black", font=small, anchor="rm")
    every = max(1, math.ceil(44 / ((right - left) / n)))  # labels ~40 px wide; the newest always shown
    for i, p in enumerate(points):
        if (n - 1 - i) % every == 0:
            draw.text((to_px(i, y0)[0], bottom + 6), p["name"], fill="black", font=small, anchor="ma")
    draw.rectangle([left, top, right, bottom], outline="black")
    draw.text(((left + right) // 2, h - 6), "registry version", fill="black", font=text_font(12), anchor="md")
    draw.text((8, top - 24), metric, fill="black", font=text_font(12))
    service, level = PALETTE[0], None  # the step line: the value in service from x - 0.5 onwards
    for i, p in enumerate(points):
        new = p.get("service")
        if _finite(level) and _finite(new) and new != level:
            draw.line([to_px(i - 0.5, level), to_px(i - 0.5, new)], fill=service, width=2)
        if _finite(new):
            draw.line([to_px(i - 0.5, new), to_px(i + 0.5, new)], fill=service, width=2)
        level = new
    r = 5 if n <= 40 else 3
    for i, p in enumerate(points):
        if not _finite(p["candidate"]):
            continue
        px, py = to_px(i, p["candidate"])
        if p.get("in_service"):
            draw.ellipse([px - r - 4, py - r - 4, px + r + 4, py + r + 4], outline=service, width=2)
        fill = PALETTE[2] if p.get("promoted") else "white"
        draw.ellipse(
            [px - r, py - r, px + r, py + r],
            fill=fill,
            outline=fill if p.get("promoted") else PALETTE[1],
            width=2,
        )
    _trend_legend(draw, right, top - 18, service)
    return png_bytes(img)


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _trend_legend(draw: ImageDraw.ImageDraw, x: float, y: float, service: str) -> None:
    """The trend chart's legend, right-aligned on one line ending at ``x``."""
    font = text_font(12)
    for name, color, mark in (("in service", service, "line"), ("rejected", PALETTE[1], "hollow"),
                              ("promoted", PALETTE[2], "filled")):  # fmt: skip
        draw.text((x, y), name, fill="black", font=font, anchor="rm")
        x -= draw.textlength(name, font=font) + 12
        if mark == "line":
            draw.line([(x - 8, y), (x + 6, y)], fill=color, width=2)
        else:
            fill = color if mark == "filled" else "white"
            draw.ellipse([x - 5, y - 5, x + 5, y + 5], fill=fill, outline=color, width=2)
        x -= 26
