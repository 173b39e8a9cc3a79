"""The dependency graph the folders promise, as facts: the import-linter contracts of
pyproject.toml hold; grimp's graph of every import (inside functions too) has no cycle; project
imports inside functions are few, each with its reason on its line; no module takes another's
private name. ``python -m tests.architecture.graph`` prints the figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

from tests.architecture.graph import PACKAGES, ROOT, build, components

MAX_IN_FUNCTION = 15  # lazy imports of a heavy path (torch, Prefect) from a light one


def test_the_import_linter_contracts_hold() -> None:
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_no_import_cycle_among_modules() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    cycles = [sorted(c) for c in components(edges) if len(c) > 1]
    assert cycles == []


def test_project_imports_inside_functions_are_few_and_each_says_why() -> None:
    inner = build().in_function()
    statements = {(imp.importer, imp.line): imp for imp in inner}
    assert len(statements) <= MAX_IN_FUNCTION, sorted(statements)
    silent = [f"{m}:{line}" for (m, line), imp in statements.items() if not imp.comment]
    assert silent == [], "an import inside a function needs its reason as a comment on its line"


def test_no_module_imports_another_modules_private_name() -> None:
    private = [f"{imp.importer}:{imp.line} {imp.imported}.{imp.names}" for imp in build().private_names()]
    assert private == []
