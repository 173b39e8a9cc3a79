"""The keypoints corpus benchmark on two cases under ``--runtime ort-training``: a one-stack
hourglass prepares as task keypoints (its probe training on the keypoints MSE), and a soft-argmax
written as a product with a 1-D vector stops with the one line that names the MatMul ONNX Runtime
cannot differentiate and how to write it (the default runtime, autograd, trains it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT
from tests.fixtures_prepare import needs_ort_training

pytestmark = pytest.mark.slow


def test_two_cases_of_the_corpus(tmp_path: Path) -> None:
    needs_ort_training()
    out = tmp_path / "keypoints_corpus.json"
    cmd = [sys.executable, str(PROJECT_ROOT / "bench" / "keypoints_corpus.py"), "--models",
           "hourglass,integral-unet-vector", "--runtime", "ort-training", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["model"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["hourglass"]["kind"] == "pass", rows["hourglass"]["message"]
    assert rows["hourglass"]["loss"] == "mse of heatmaps (Gaussian targets, sigma 2)"
    vector = rows["integral-unet-vector"]
    assert vector["kind"] == "specific" and "\n" not in vector["message"]
    assert "cannot differentiate MatMul node /MatMul" in vector["message"]
    assert "write it as (x * v).sum(-1) or multiply by a [n, 1] matrix" in vector["message"]
