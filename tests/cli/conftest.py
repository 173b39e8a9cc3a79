"""Fixtures of the CLI tests: one ``odl flow`` of a thousand steps run from a user's own folder,
whose output two tests read (tests/cli/test_terminal.py: the relative recipe path and plain progress;
tests/cli/test_quiet_output.py: the summary once, the bounded lines). A flow costs ~25 s of fixed work
(a fresh Prefect database, the preparation) whatever its steps, so it runs once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.kit import FlowRun, odl_env, user_folder
from tests.fixtures_board import make_local_home


@pytest.fixture(scope="session")
def flow_from_elsewhere(
    tmp_path_factory: pytest.TempPathFactory, board_python: Path, digits_recipe
) -> FlowRun:
    """``odl flow ../elsewhere/recipe.toml --board here --batch-size 4`` from the user's folder, into a
    fresh ODL_HOME of its own with the local board ``here``: 400 samples at batch 4 for 10 epochs, a
    thousand steps."""
    base = tmp_path_factory.mktemp("flow-elsewhere")
    cwd = user_folder(base, digits_recipe)
    home = make_local_home(base / "home", board_python)
    args = ["flow", "../elsewhere/recipe.toml", "--board", "here", "--batch-size", "4"]
    res = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=odl_env(home, base),
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    return FlowRun(home, res.returncode, res.stdout, res.stderr)
