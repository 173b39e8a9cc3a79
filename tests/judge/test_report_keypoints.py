"""The report of keypoints: OKS AP and PCK rows, the per-keypoint PCK and error table of every model,
the gate's interval, and test images with the true and each model's keypoints drawn."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
from PIL import Image

from tasks.judge.charts import MASK_PALETTE
from tasks.judge.keypoints import keypoint_metrics
from tasks.judge.registry import decide
from tasks.judge.report import ReportInput, render_report
from tasks.judge.report_keypoints import keypoints_chart
from tasks.recipe.extras import PromotionSpec
from tasks.recipe.keypoints import KeypointsSpec

NAMES = ("head", "hand", "foot")


def _scene(tmp_path, n: int = 30):
    rng = np.random.default_rng(0)
    y = np.zeros((n, 3, 3), np.float32)
    y[..., :2] = rng.uniform(4, 28, (n, 3, 2))
    y[..., 2] = 2
    path = tmp_path / "test.npz"
    np.savez(path, x=rng.normal(0, 1, (n, 3, 32, 32)).astype(np.float32), y=y)
    spec = KeypointsSpec(count=3, names=NAMES)
    guesses = [y[..., :2] + rng.normal(0, s, y[..., :2].shape) for s in (3.0, 0.5)]
    return path, [keypoint_metrics(g.astype(np.float32), y, spec, (32, 32)) for g in guesses]


def test_the_report_shows_oks_ap_the_per_keypoint_table_and_drawn_keypoints(tmp_path):
    path, (base, cand) = _scene(tmp_path)
    decision = decide(cand, base, PromotionSpec(metric="oks_ap"), "base")
    assert decision.promote
    md = render_report(ReportInput(recipe="pose", board="b", flow_run_id="f", job_id="j", test_set="test.npz",
                                   evaluations={"base": base, "candidate": cand}, decision=decision,
                                   version="v0001", test_path=path))  # fmt: skip
    assert f"| OKS AP@[.5:.95] | {base['oks_ap']:.4f} | {cand['oks_ap']:.4f} |" in md
    assert "| PCK |" in md and "| OKS AP@0.5 |" in md
    assert "| keypoint | PCK base | error px base | PCK candidate | error px candidate |" in md
    hand = cand["per_keypoint"]["hand"]
    assert f"| hand | {base['per_keypoint']['hand']['pck']:.3f} |" in md and f"{hand['error_px']:.2f} |" in md
    assert "the oks_ap gain" in md and "Per-class AP gain" not in md
    found = re.findall(r"!\[(test keypoints \d)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", md)
    assert [name for name, _ in found] == ["test keypoints 0", "test keypoints 1", "test keypoints 2"]
    assert Image.open(io.BytesIO(base64.b64decode(found[0][1]))).width > 3 * 160


def test_each_keypoint_is_a_disc_of_its_colour_where_it_lies():
    points = np.array([[8.0, 8.0, 2], [24.0, 16.0, 2], [16.0, 28.0, 0]])
    img = Image.open(io.BytesIO(keypoints_chart(np.zeros((3, 32, 32), np.float32), {"truth": points}, NAMES)))
    img = img.convert("RGB")
    pad, title = 8, 22  # the panel's margin and title band; 160 pixels a side: 5 per input pixel
    assert img.getpixel((pad + 40, title + 40)) == MASK_PALETTE[0]
    assert img.getpixel((pad + 120, title + 80)) == MASK_PALETTE[1]
    assert img.getpixel((pad + 80, title + 140)) == (0, 0, 0)  # visibility 0: not drawn
