"""Running a task corpus benchmark's seeded sample (``--quick``) from a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tasks.paths import PROJECT_ROOT


def sample_rows(
    script: str, quick: int, seed: int, tmp_path: Path, runtime: str | None = None
) -> dict[str, dict]:
    """``bench/<script> --quick <quick> --seed <seed>``'s rows by model (``--runtime``: the default,
    or ``runtime``), after checking that it ran and that every row passed or stopped with one
    specific line (none raw)."""
    out = tmp_path / "corpus.json"
    cmd = [sys.executable, str(PROJECT_ROOT / "bench" / script), "--quick", str(quick), "--seed", str(seed),
           "--out", str(out), *(["--runtime", runtime] if runtime else [])]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    rows = {r["model"]: r for r in figures["rows"]}
    assert figures["raw"] == 0, [r["message"] for r in rows.values() if r["kind"] == "raw"]
    assert all(r["kind"] == "pass" or "\n" not in r["message"] for r in rows.values())
    return rows
