"""``odl recipe schema [--out PATH]``: the recipe's JSON Schema, for editors that check TOML files
(VS Code's Even Better TOML / Taplo: a ``#:schema`` first line in a recipe, or ``.taplo.toml``)."""

from __future__ import annotations

import argparse
import sys

from tasks.recipe.load import json_schema_text


def cmd_schema(args: argparse.Namespace) -> int:
    """Write the recipe's JSON Schema to ``--out`` (stdout without it)."""
    text = json_schema_text()
    if args.out is None:
        sys.stdout.write(text)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0
