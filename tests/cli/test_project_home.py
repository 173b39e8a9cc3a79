"""The project home (issue 46): found as git finds its repository, from the current folder up; a
board missing from it is one line naming ODL_HOME, before Prefect starts (it printed "Failed to
create the Prefect home directory" first)."""

from __future__ import annotations

import os
import subprocess
import sys

from tasks.paths import PROJECT_ROOT, home_hint, odl_home


def test_the_home_is_the_nearest_odl_folder_from_the_current_one_up(tmp_path, monkeypatch) -> None:
    (tmp_path / ".odl").mkdir()
    deep = tmp_path / "recipes" / "mine"
    deep.mkdir(parents=True)
    monkeypatch.delenv("ODL_HOME", raising=False)
    monkeypatch.chdir(deep)
    assert odl_home() == (tmp_path / ".odl").resolve()
    hint = f"ODL_HOME is not set: the nearest .odl/ from the current folder up is {odl_home()}"
    assert home_hint() in (hint, f"{hint}; set ODL_HOME={PROJECT_ROOT / '.odl'} for the project's home")
    monkeypatch.setenv("ODL_HOME", str(tmp_path / "other"))
    assert odl_home() == (tmp_path / "other").resolve() and home_hint() == f"ODL_HOME={tmp_path / 'other'}"


def test_odl_flow_from_a_folder_without_a_home_names_odl_home_and_starts_no_prefect(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ODL_", "PREFECT_"))}
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "flow", "--board", "x"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("odl: error: board 'x' is not in ") and "ODL_HOME" in lines[0], lines
    assert "Prefect home" not in proc.stderr + proc.stdout
