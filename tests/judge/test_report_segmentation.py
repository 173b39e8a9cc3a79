"""The report of a segmentation: mIoU rows, the per-class IoU table of every model, the gate's object
class check and per-class IoU intervals, and test images with the truth and each model's mask drawn
in the fixed palette."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
from PIL import Image

from tasks.judge.charts import MASK_ALPHA, MASK_PALETTE, masks_chart
from tasks.judge.registry import decide
from tasks.judge.report import ReportInput, render_report
from tasks.judge.segmentation import segmentation_metrics
from tasks.recipe.extras import PromotionSpec

CLASSES = ["background", "square", "disc"]


def _scene(tmp_path, n: int = 24, side: int = 16):
    """A test set (black images, one square of class 1 or 2 each) and two models' scores: the truth
    with a few errors, and background everywhere but a corner."""
    rng = np.random.default_rng(0)
    y = np.zeros((n, side, side), np.int64)
    for i in range(n):
        y[i, 4:12, 4:12] = 1 + i % 2
    y[:, 0, :] = 255
    good = np.where(rng.uniform(size=y.shape) < 0.95, np.where(y == 255, 0, y), 0)
    poor = np.zeros_like(y)
    poor[:, :3, :3] = 2
    path = tmp_path / "test.npz"
    np.savez(path, x=np.zeros((n, 3, side, side), np.float32), y=y)
    scores = [np.eye(3, dtype=np.float32)[p].transpose(0, 3, 1, 2) for p in (poor, good)]
    return path, [segmentation_metrics(s, y, CLASSES, 255) for s in scores]


def _images(md: str) -> dict[str, Image.Image]:
    found = re.findall(r"!\[([^\]]+)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", md)
    return {name: Image.open(io.BytesIO(base64.b64decode(b64))) for name, b64 in found}


def test_the_report_shows_iou_per_class_the_gate_and_drawn_masks(tmp_path):
    path, (base, cand) = _scene(tmp_path)
    decision = decide(cand, base, PromotionSpec(metric="miou"), "base")
    md = render_report(ReportInput(recipe="seg", board="b", flow_run_id="f", job_id="j", test_set="test.npz",
                                   evaluations={"base": base, "candidate": cand}, decision=decision,
                                   version="v0001", test_path=path))  # fmt: skip
    assert f"| mIoU | {base['miou']:.4f} | {cand['miou']:.4f} |" in md
    assert "| pixel accuracy |" in md and "| mIoU of the object classes |" in md
    assert "| class | IoU base | IoU candidate |" in md
    assert f"| square | {base['per_class_iou']['square']:.3f} | {cand['per_class_iou']['square']:.3f} |" in md
    assert "| object classes | holds | object mIoU gain [" in md
    assert "Per-class IoU gain, same bootstrap resamples of the test images: background [" in md
    images = _images(md)
    masks = [k for k in images if k.startswith("test masks")]
    assert masks == ["test masks 0", "test masks 1", "test masks 2"] and "confusion matrix" in images
    for name in masks:
        assert images[name].format == "PNG" and images[name].width > 3 * 160


def test_each_class_is_drawn_in_its_palette_colour_over_the_image():
    mask = np.zeros((8, 8), np.int64)
    mask[2:6, 2:6] = 2
    mask[0, :] = 255
    png = masks_chart(
        np.zeros((3, 8, 8), np.float32), {"truth": mask}, CLASSES, background=0, ignore_index=255
    )
    img = Image.open(io.BytesIO(png)).convert("RGB")
    side, pad, title = 160, 8, 22
    centre = img.getpixel((pad + side // 2, title + side // 2))
    assert centre == tuple(int(MASK_ALPHA * c) for c in MASK_PALETTE[2])
    assert img.getpixel((pad + 5, title + 5)) == tuple(
        int(MASK_ALPHA * 255) for _ in range(3)
    )  # ignored: white
    assert img.getpixel((pad + 5, title + side - 5)) == (0, 0, 0)  # background: the image itself
