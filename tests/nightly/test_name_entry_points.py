"""Every host entry point a name reaches the board or the project home through gives the name rule's
answer (``device_agent.names``), with its one refusal line and nothing created: ``odl data push
--to`` and the pushed file's name, ``odl report NAME BOARD``, the inventory's board and group entries."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import example, given, settings

from device_agent.names import refusal
from device_agent.protocol import NAME
from tasks.board.inventory import BOARD_NAME, load_groups, load_inventory
from tasks.errors import BoardError, HostExit
from tests.agent.names_kit import META, good, mixed, toml_str, tree
from tests.fixtures_board import make_local_home


def odl(home: Path, *argv: str) -> tuple[int, str, str]:
    """``odl ARGV`` in this process with ``ODL_HOME=home``: exit status, stdout, stderr."""
    from flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, {"ODL_HOME": str(home)}):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def push_home(tmp_path_factory: pytest.TempPathFactory, board_python: Path) -> Path:
    """An ODL_HOME of these push tests' own with the local board ``here`` (not the session's
    local_board_home, which the flow tests fill with runs, models and a Prefect database): each push
    reads every byte of the home before and after, to show a refused one created nothing."""
    return make_local_home(tmp_path_factory.mktemp("push-home"), board_python)


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("host") / "shard-0001.npz"
    path.write_bytes(b"a shard")
    return path


@settings(max_examples=25, deadline=None)
@given(mixed)
@example("x;touch /tmp/pwned")
@example("$(touch ")
@example("a\nb")
@example("/etc/cron.d")
@example("datasets/cam/night1")
def test_push_destination_answers_as_the_rule(push_home: Path, shard: Path, value: str) -> None:
    root = Path(load_inventory(push_home / "inventory.toml")["here"].root)
    before = tree(push_home)
    code, _, err = odl(push_home, "data", "push", "here", str(shard), f"--to={value}")
    if NAME.path_ok(value):
        assert code == 0, err
        assert (root / value / shard.name).read_bytes() == b"a shard"
        return
    assert code == HostExit.DATA
    assert err == f"odl: error: {refusal('--to', value, NAME.path_allowed)}\n"
    assert tree(push_home) == before  # the board root lives in this home: nothing anywhere
    assert not Path("/tmp/pwned").exists()


@pytest.mark.parametrize("name", ["$(touch x).npz", "a b.npz", "-rf.npz", "é.npz"])
def test_a_pushed_file_whose_name_is_not_a_name_is_refused(
    push_home: Path, tmp_path: Path, name: str
) -> None:
    bad = tmp_path / name
    bad.write_bytes(b"x")
    before = tree(push_home)
    code, _, err = odl(push_home, "data", "push", "here", str(bad), "--to=datasets/files")
    assert code == HostExit.DATA and err == f"odl: error: {refusal('file name', name, NAME.allowed)}\n"
    assert tree(push_home) == before


@settings(max_examples=200, deadline=None)
@given(mixed.filter(lambda v: not v.endswith(".toml")))
@example("../../etc")
def test_report_names_answer_as_the_rule(tmp_path_factory: pytest.TempPathFactory, value: str) -> None:
    home = tmp_path_factory.getbasetemp() / "report-home"
    (home / "reports" / "etc-vboard").mkdir(parents=True, exist_ok=True)
    before = tree(home)
    for argv, field in (
        (["report", "--", value, "vboard"], "recipe"),
        (["report", "--", "digits", value], "board"),
    ):
        code, out, err = odl(home, *argv)
        if NAME.ok(value):
            assert code == 1 and "no report of" in out, err
        else:
            assert code == HostExit.REGISTRY
            assert err == f"odl: error: {refusal(field, value, NAME.allowed)}\n"
        assert tree(home) == before


def test_a_recipe_file_declaring_a_bad_name_is_named_in_the_refusal(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "../../etc"\n')
    code, _, err = odl(tmp_path, "report", str(recipe))
    assert code == HostExit.REGISTRY
    assert err == f"odl: error: {refusal('recipe', '../../etc', NAME.allowed, str(recipe), 'name')}\n"


INVENTORY = '[boards.good-one]\ntransport = "local"\nroot = "/tmp/odl-good"\n'


@settings(max_examples=300, deadline=None)
@given(mixed)
@example("a;b")
@example("Bad Name")
def test_inventory_entries_answer_as_the_rule_naming_the_file_and_entry(
    tmp_path_factory: pytest.TempPathFactory, value: str
) -> None:
    path = tmp_path_factory.getbasetemp() / "inventory.toml"
    path.write_text(f'{INVENTORY}[boards.{toml_str(value)}]\ntransport = "local"\nroot = "/tmp/odl-x"\n')
    if BOARD_NAME.ok(value):
        assert set(load_inventory(path)) == {"good-one", value}
        return
    with pytest.raises(BoardError) as info:
        load_inventory(path)
    assert str(info.value) == refusal("board name", value, BOARD_NAME.allowed, str(path), f"[boards.{value}]")
    path.write_text(f'{INVENTORY}[groups]\nlab = ["good-one", {toml_str(value)}]\n')
    with pytest.raises(BoardError) as info:
        load_groups(path)
    assert str(info.value) == refusal("board name", value, BOARD_NAME.allowed, str(path), "[groups] lab")


@settings(max_examples=100, deadline=None)
@given(good)
def test_every_name_refused_by_the_rule_is_refused_as_a_board_name_too(value: str) -> None:
    for bad in (f"-{value}", f"{value}..", f"{value}/x", *(f"{value}{m}" for m in META if m not in "._-")):
        assert not NAME.ok(bad) and not BOARD_NAME.ok(bad), bad
    assert BOARD_NAME.ok(value) == (
        len(value) <= 20 and value == value.lower() and "." not in value and "_" not in value
    )


@pytest.mark.parametrize("path", ["../x", "datasets/../../x", "datasets/my cam", "a\nb"])
def test_data_list_and_a_recipe_refuse_a_board_path_the_agent_would_refuse(
    local_board_home: Path, path: str
) -> None:
    from device_agent.protocol import BOARD_PATH_ALLOWED
    from tasks.errors import RecipeError
    from tasks.recipe.load import parse_recipe
    from tests.prepare.kit import BASE, merge

    code, _, err = odl(local_board_home, "data", "list", "here", "--", path)
    assert code == HostExit.DATA and err == f"odl: error: {refusal('path', path, BOARD_PATH_ALLOWED)}\n"
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(BASE, {"data": {"board_dataset": path}}), local_board_home / "r.toml")
    assert info.value.field == "data.board_dataset" and info.value.expected == BOARD_PATH_ALLOWED
