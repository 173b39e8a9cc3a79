"""The manual's reference, generated from the code: ``python -m docs.gen`` rewrites ``docs/reference/``.

Each page is a function returning its Markdown; :data:`PAGES` maps file names to them. Nothing here is
written by hand about a recipe key, a command, an exit code, a deployment parameter or the agent's wire
types: it is read from the schema, the argparse parser, ``HOST_EXITS``, ``deploy/prefect.yaml`` and the
flows' parameter models, and ``device_agent/protocol.py``. ``tests/docs/test_reference.py`` regenerates
the pages into a temporary folder and compares them with the committed ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from docs.gen.cli import cli_page
from docs.gen.contract import errors_page, exit_codes_page, protocol_page
from docs.gen.deployments import deployments_page
from docs.gen.recipe import recipe_page

REFERENCE = Path(__file__).resolve().parents[1] / "reference"

INDEX = """# Reference

Generated from the code by `python -m docs.gen` (a test regenerates these pages and fails when they
differ from the committed ones, so they cannot drift). Do not edit them by hand: change the code
they are read from, then run the generator.

| page | read from |
|---|---|
| [Recipe keys](recipe.md) | `tasks/recipe/` (the pydantic schema; the same as `recipes/recipe.schema.json`) |
| [Command line](cli.md) | `flows/cli/parser.py` (the argparse parser of `odl`) |
| [Exit codes](exit-codes.md) | `tasks/exits.py` (`HOST_EXITS`) and `device_agent/protocol.py` (`ExitCode`) |
| [Errors](errors.md) | `tasks/exits.py` and `tasks/errors.py`: every `odl: error:` class and what to do |
| [Deployments](deployments.md) | `deploy/prefect.yaml` and the flows' parameter models (`flows/odl.py`, `flows/fleet.py`) |
| [Board agent protocol](agent-protocol.md) | `device_agent/protocol.py` and the wire types beside it |
"""

PAGES: dict[str, Callable[[], str]] = {
    "index.md": lambda: INDEX,
    "recipe.md": recipe_page,
    "cli.md": cli_page,
    "exit-codes.md": exit_codes_page,
    "errors.md": errors_page,
    "deployments.md": deployments_page,
    "agent-protocol.md": protocol_page,
}


def write(folder: Path = REFERENCE, names: list[str] | None = None) -> list[Path]:
    """Write the reference pages (all, or ``names``) into ``folder``; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names or list(PAGES):
        path = folder / name
        path.write_text(PAGES[name]().rstrip("\n") + "\n")
        out.append(path)
    return out
