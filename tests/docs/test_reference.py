"""The generated reference (docs/reference/) equals what ``python -m docs.gen`` writes from the code today,
so a recipe key, command, flag, exit code, deployment parameter or wire field cannot drift from it."""

from __future__ import annotations

from pathlib import Path

from docs.gen import PAGES, REFERENCE, write


def test_the_committed_reference_is_what_the_code_generates(tmp_path: Path) -> None:
    written = write(tmp_path)
    stale = [p.name for p in written if (REFERENCE / p.name).read_text() != p.read_text()]
    assert not stale, f"regenerate: .venv/bin/python -m docs.gen  (stale: {stale})"
    extra = sorted({p.name for p in REFERENCE.glob("*.md")} - set(PAGES))
    assert not extra, f"docs/reference/ holds pages the generator does not write: {extra}"


def test_every_recipe_key_and_command_is_in_the_reference() -> None:
    from flows.cli.parser import build_parser
    from tasks.recipe.load import json_schema

    recipe = (REFERENCE / "recipe.md").read_text()
    schema = json_schema()
    for definition in schema["definitions"].values():
        for key in definition.get("properties", {}):
            assert f".{key}`" in recipe or f".{key}]`" in recipe, key  # a key, or a sub-table's heading
    cli = (REFERENCE / "cli.md").read_text()
    commands = next(a for a in build_parser()._actions if a.choices and a.dest == "command").choices
    assert all(f"## `odl {name}`" in cli for name in commands)
