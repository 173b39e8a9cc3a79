"""The segmentation corpus benchmark on a seeded sample of two cases (torchvision's LR-ASPP by name:
a dict output of symbolic size; a U-Net with Dropout2d in its decoder): each prepares as task
segmentation, its probe training on the per-pixel loss, and nothing stops with a raw error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT

pytestmark = pytest.mark.slow


def test_a_seeded_sample_of_the_corpus_prepares(tmp_path: Path) -> None:
    out = tmp_path / "segmentation_corpus.json"
    cmd = [sys.executable, str(PROJECT_ROOT / "bench" / "segmentation_corpus.py"), "--quick", "2",
           "--seed", "139", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    rows = {r["model"]: r for r in figures["rows"]}
    assert set(rows) == {"tv-lraspp_mobilenet_v3_large", "unet-dropout2d"}
    assert all(r["kind"] == "pass" for r in rows.values()), [r["message"] for r in rows.values()]
    sys.path.insert(0, str(PROJECT_ROOT / "recipes"))
    from unet import unet

    every = sum(p.numel() for p in unet(4, dropout=0.1).parameters())
    assert rows["unet-dropout2d"]["trainable"] == every  # strategy "all": every torch parameter
