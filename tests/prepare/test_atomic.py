"""``odl prepare`` builds in a temporary sibling folder and renames it into place only when every
step passed: a failed prepare leaves nothing behind and an earlier prepared folder intact."""

from __future__ import annotations

import pytest

from flows.cli import main
from tasks.errors import HostExit
from tests.prepare.kit import write_recipe


def _odl_prepare(recipe, out, capsys) -> tuple[int, str]:
    code = main(["prepare", str(recipe.source), "--out", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, "\n".join(line for line in err.splitlines() if line.startswith("odl: "))


def _left(tmp_path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".out", "out")))


@pytest.fixture
def recipe_file(tmp_path):
    """Write the tiny recipe (with ``changes``) as tmp_path/recipe.toml and return it parsed."""
    from tasks.recipe.load import load_recipe

    return lambda changes=None: load_recipe(write_recipe(tmp_path, changes))


FAILURES = {
    "corrupt ONNX": ({"model": {"callable": None, "onnx": "broken.onnx"}}, HostExit.MODEL),
    "pattern matching nothing": (
        {"trainable": {"strategy": None, "patterns": ["nothing*"]}},
        HostExit.RECIPE,
    ),
    "NaN data": ({"data": {"make": "tinymodels:make_nan"}}, HostExit.DATA),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failed_prepare_leaves_no_folder(case, tmp_path, recipe_file, capsys):
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx file")
    changes, code = FAILURES[case]
    recipe = recipe_file(changes)
    got, err = _odl_prepare(recipe, tmp_path / "out", capsys)
    assert got == code and err.count("\n") == 0, err
    assert _left(tmp_path) == []


def test_a_good_prepare_replaces_an_earlier_one_and_a_failed_one_keeps_it(tmp_path, recipe_file, capsys):
    recipe = recipe_file()
    assert _odl_prepare(recipe, tmp_path / "out", capsys)[0] == 0
    first = (tmp_path / "out" / "manifest.json").read_text()
    (tmp_path / "out" / "stale.txt").write_text("from an earlier prepare")
    assert _odl_prepare(recipe, tmp_path / "out", capsys)[0] == 0
    assert not (tmp_path / "out" / "stale.txt").exists()  # replaced as a whole, not written over
    second = (tmp_path / "out" / "manifest.json").read_text()
    assert first != "" and second != ""
    bad = recipe_file({"optimizer": {"kind": "sgd", "lr": 1e-30}})  # the loss cannot fall
    assert _odl_prepare(bad, tmp_path / "out", capsys)[0] == HostExit.VALIDATION
    assert (tmp_path / "out" / "manifest.json").read_text() == second and _left(tmp_path) == ["out"]


def test_a_folder_of_other_files_is_refused_untouched(tmp_path, recipe_file, capsys):
    recipe = recipe_file()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    code, err = _odl_prepare(recipe, tmp_path / "out", capsys)
    assert code == HostExit.PIPELINE and "not a prepared recipe" in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]
