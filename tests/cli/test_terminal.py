"""What a user sees in the terminal: relative recipe paths against the current folder, one line per
error (the traceback with -v), no library chatter, progress without a terminal as plain lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.errors import BoardError, RecipeError
from tasks.paths import PROJECT_ROOT
from tests.cli.kit import FlowRun, user_folder

CHATTER = ("httpx", "paramiko", "HTTP Request", "Traceback")


def _odl(args: list[str], cwd: Path, home: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"ODL_HOME": str(home), "PYTHONPATH": str(PROJECT_ROOT)}
    env.pop("PREFECT_API_URL", None)
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.fixture
def cli_home(tmp_path: Path, board_python: Path) -> Path:
    """An ODL_HOME of this test alone (its own registry) with a local-transport board ``here``."""
    from tasks.board.inventory import Board, save_board

    home = tmp_path / "home"
    board = Board(name="here", transport="local", root=str(tmp_path / "board"), python=str(board_python))
    save_board(board, home / "inventory.toml")
    return home


@pytest.fixture
def elsewhere(tmp_path: Path, digits_recipe) -> Path:
    """A user's own folder: a copy of the digits recipe (its data shared), and a folder beside it."""
    return user_folder(tmp_path, digits_recipe)


def test_bad_recipe_under_odl_flow_prints_one_line(elsewhere: Path, cli_home: Path) -> None:
    bad = elsewhere / "bad.toml"
    bad.write_text('name = "x"\n[model]\n')
    res = _odl(["flow", "bad.toml", "--board", "here"], elsewhere, cli_home)
    assert res.returncode == RecipeError.exit_code
    assert res.stderr.strip().splitlines() == [
        f"odl: error: {bad}: recipe field 'model.torchvision': expected exactly one of model.torchvision, "
        "model.callable, model.onnx"
    ]
    res = _odl(["flow", "../elsewhere/recipe.toml", "--board", "Bad_Name"], elsewhere, cli_home)
    assert res.returncode == BoardError.exit_code and len(res.stderr.strip().splitlines()) == 1
    res = _odl(["flow", "../elsewhere/recipe.toml", "--board", "here", "--epochs", "0"], elsewhere, cli_home)
    assert res.returncode == RecipeError.exit_code and "'--epochs'" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_verbose_shows_the_traceback(elsewhere: Path, cli_home: Path) -> None:
    res = _odl(["flow", "missing.toml", "-v"], elsewhere, cli_home)
    assert res.returncode == RecipeError.exit_code
    assert "Traceback" in res.stderr and str(elsewhere / "missing.toml") in res.stderr


@pytest.mark.slow
def test_odl_run_from_another_folder_shows_plain_progress_and_no_chatter(
    elsewhere: Path, cli_home: Path
) -> None:
    res = _odl(["run", "../elsewhere/recipe.toml", "--board", "here", "--set", "training.epochs=2"],
               elsewhere, cli_home)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "job digits-" in res.stdout and ": finished, 26 steps, 2 epochs" in res.stdout
    lines = res.stderr.splitlines()
    assert any(line.startswith("train step 26/26 ") for line in lines)
    assert any(line.startswith("board: epoch epoch=2") for line in lines)
    assert not [line for line in lines if any(word in line for word in CHATTER)]


@pytest.mark.slow
def test_odl_flow_from_another_folder(flow_from_elsewhere: FlowRun) -> None:
    """``odl flow ../elsewhere/recipe.toml`` from a folder beside the recipe's (the session's one flow
    of a thousand steps, tests/cli/conftest.py) finds the recipe, its model module and its data, says
    first that it runs on a temporary Prefect server, prints plain progress and no library chatter."""
    res = flow_from_elsewhere
    assert res.returncode == 0, res.stderr[-3000:]
    assert "digits on here:" in res.stdout
    lines = res.stderr.splitlines()
    assert "flow run on a temporary Prefect server" in lines[0]
    assert any(line.startswith("train step 1000/1000 ") for line in lines)
    assert not [line for line in lines if any(word in line for word in CHATTER)]
