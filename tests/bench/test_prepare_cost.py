"""The preparation-cost benchmark on two small sequence cases (a conv1d with BatchNorm and a GRU),
each prepared under both training runtimes in its own child: every row has the seconds, the board
peak estimate and the result under each runtime, and the summary's ratios are the rows'."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT

pytestmark = pytest.mark.slow


def test_two_sequence_cases_under_both_runtimes_give_their_ratios(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    cmd = [sys.executable, str(PROJECT_ROOT / "bench" / "prepare_cost.py"), "--corpora", "sequences",
           "--models", "conv1d-bn,gru-mean", "--timeout", "300", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    rows = {r["case"]: r for r in figures["rows"]}
    assert set(rows) == {"sequences/conv1d-bn", "sequences/gru-mean"}
    for r in rows.values():
        for side in ("ort", "ag"):
            assert r[f"{side}_kind"] == "pass", r[f"{side}_message"]
            assert r[f"{side}_s"] > 0 and r[f"{side}_mb"] > 0
        assert r["ratio_s"] == round(r["ag_s"] / r["ort_s"], 3)
        assert r["ratio_mb"] == round(r["ag_mb"] / r["ort_mb"], 3)
    assert figures["both_pass"] == 2
    ratios = [r["ratio_s"] for r in rows.values()]
    assert figures["ratio_seconds"] == {"median": round(statistics.median(ratios), 3), "worst": max(ratios)}
    peaks = [r["ratio_mb"] for r in rows.values()]
    assert figures["ratio_peak"] == {"median": round(statistics.median(peaks), 3), "worst": max(peaks)}
    assert figures["only_passes"] == {"ort-training": [], "autograd": []}
    assert "autograd/ORT preparation seconds: median" in proc.stdout
