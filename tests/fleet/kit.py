"""What the fleet flow tests share: the digits fleet's data, and local-transport boards each holding
one share of a split (its labels flipped when asked), saved in the test home's inventory."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[2] / "recipes" / "data" / "digits-fleet"


def prepare_fleet_data() -> None:
    """The digits fleet's data (base weights, test set, the splits), made once."""
    from tasks import stages
    from tasks.paths import PROJECT_ROOT
    from tasks.recipe.load import load_recipe

    stages.prepare_data(load_recipe(PROJECT_ROOT / "recipes" / "digits_fleet.toml"))


def local_board(home: Path, name: str, share: Path, python: str, *, flip: bool = False) -> None:
    """Board ``name`` (local transport, root ``home/fleet-<name>``, a fresh one) whose dataset folder
    holds ``share`` (an npz of x, y), its labels ``9 - y`` with ``flip``."""
    from tasks.board.inventory import Board, save_board

    root = home / f"fleet-{name}"
    shutil.rmtree(root, ignore_errors=True)
    (root / "datasets" / "digits").mkdir(parents=True)
    with np.load(share) as z:
        x, y = z["x"], z["y"]
    np.savez(root / "datasets" / "digits" / "part-1.npz", x=x, y=(9 - y) if flip else y)
    save_board(Board(name=name, transport="local", root=str(root), python=python))
