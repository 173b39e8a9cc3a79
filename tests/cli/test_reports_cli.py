"""The small things a newcomer trips on: ``odl report`` by recipe file or name with the known
reports listed, a closed pipe (``| head``) without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tasks.paths import PROJECT_ROOT


def _odl(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"ODL_HOME": str(home), "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_report_by_file_or_name_and_the_known_ones_listed(tmp_path: Path):
    folder = tmp_path / "reports" / "mobilenet-v2-wiki-vboard"
    folder.mkdir(parents=True)
    (folder / "latest.txt").write_text("mobilenet-v2-wiki on vboard: PROMOTED\n" + "line\n" * 50)
    recipe = tmp_path / "mobilenet_v2.toml"
    recipe.write_text('name = "mobilenet-v2-wiki"\n')
    by_file = _odl(["report", str(recipe), "vboard"], tmp_path)
    assert by_file.returncode == 0 and by_file.stdout.startswith("mobilenet-v2-wiki on vboard: PROMOTED")
    assert _odl(["report", "mobilenet-v2-wiki"], tmp_path).returncode == 0
    missing = _odl(["report", "mobilenet_v2", "vboard"], tmp_path)
    assert missing.returncode == 1
    assert "no report of mobilenet_v2 on vboard yet" in missing.stdout
    assert "mobilenet-v2-wiki-vboard" in missing.stdout  # what the user can ask for instead


def test_a_closed_pipe_ends_quietly(tmp_path: Path):
    folder = tmp_path / "reports" / "digits-vboard"
    folder.mkdir(parents=True)
    (folder / "latest.md").write_text("# report\n" + "a line of the report\n" * 20000)
    env = os.environ | {"ODL_HOME": str(tmp_path), "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.run(f"{sys.executable} -m flows.cli report digits vboard --markdown | head -3",
                          shell=True, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.stdout.splitlines()[0] == "# report" and len(proc.stdout.splitlines()) == 3
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
