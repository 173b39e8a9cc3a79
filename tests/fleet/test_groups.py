"""Inventory groups (``[groups]``) and the recipe's ``[fleet]`` table: clear errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.board.inventory import Board, get_group, load_groups, remove_board, save_board, save_group
from tasks.errors import BoardError, RecipeError
from tasks.paths import PROJECT_ROOT


def _inv(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.toml"
    for name in ("b1", "b2", "b3"):
        save_board(Board(name=name, transport="local", root=str(tmp_path / name)), path)
    return path


def test_groups_survive_board_edits_and_lose_removed_members(tmp_path):
    path = _inv(tmp_path)
    save_group("lab", ["b1", "b2", "b3"], path)
    save_board(Board(name="b4", transport="local", root=str(tmp_path / "b4")), path)
    assert load_groups(path) == {"lab": ("b1", "b2", "b3")}
    assert remove_board("b2", path)
    assert [b.name for b in get_group("lab", path)] == ["b1", "b3"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('lab = ["b1", "nope"]', "board 'nope' is not in the inventory"),
        ('lab = ["b1", "b1"]', "listed twice"),
        ("lab = []", "non-empty list of board names"),
        (
            '"Bad Name" = ["b1"]',
            r"group name \(.*inventory.toml entry '\[groups\] Bad Name'\): 'Bad Name' is not a valid name",
        ),
        (
            'lab = ["b1", "x;y"]',
            r"board name \(.*inventory.toml entry '\[groups\] lab'\): 'x;y' is not a valid name",
        ),
        ('b1 = ["b1", "b2"]', "cannot share a board's name"),
    ],
)
def test_wrong_groups_are_refused_naming_the_entry(tmp_path, text, match):
    path = _inv(tmp_path)
    path.write_text(path.read_text() + f"\n[groups]\n{text}\n")
    with pytest.raises(BoardError, match=match):
        load_groups(path)


def test_unknown_group_lists_the_known_ones(tmp_path):
    path = _inv(tmp_path)
    save_group("lab", ["b1"], path)
    with pytest.raises(BoardError, match=r"group 'shelf' is not in .*known groups: lab"):
        get_group("shelf", path)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"fleet.strategy": "fedsgd"}, "fleet.strategy"),
        ({"fleet.rounds": 0}, "fleet.rounds"),
        ({"fleet.deadline_s": 0}, "fleet.deadline_s"),
        ({"fleet.server_lr": 0}, "fleet.server_lr"),
        ({"fleet.quorum": 2}, "fleet.quorum"),
    ],
)
def test_fleet_table_errors_name_the_field(override, field):
    from tasks.recipe.load import load_recipe

    with pytest.raises(RecipeError, match=field.replace(".", r"\.")):
        load_recipe(PROJECT_ROOT / "recipes" / "digits_fleet.toml", override)


def test_fleet_table_does_not_change_what_is_built():
    from tasks.recipe.load import load_recipe
    from tasks.stages.prepare import recipe_build_hash

    path = PROJECT_ROOT / "recipes" / "digits_fleet.toml"
    a = load_recipe(path)
    b = load_recipe(path, {"fleet.rounds": 7, "fleet.strategy": "fedadam"})
    assert b.fleet.rounds == 7 and b.fleet.server_lr == 0.03  # fedadam's default server step
    assert recipe_build_hash(a) == recipe_build_hash(b)
