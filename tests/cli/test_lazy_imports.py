"""What the ``odl`` command loads: ``odl --help`` no command module at all, a light command only its
own area, and no command module Prefect (``odl flow`` points Prefect at the stack before importing
it, because Prefect reads its settings once, when imported)."""

from __future__ import annotations

import subprocess
import sys

from tasks.paths import PROJECT_ROOT

HEAVY = ("torch", "onnx", "onnxruntime", "prefect")
AREAS = ("prepare", "home", "run", "board", "nightly", "recipe")


def _loaded_after(code: str) -> set[str]:
    """The modules of ``HEAVY`` and ``flows.cli.<area>`` in ``sys.modules`` after ``code`` ran."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=PROJECT_ROOT,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = set(proc.stdout.split())
    return {m for m in names if m in HEAVY or m.removeprefix("flows.cli.") in AREAS}


def test_help_imports_no_command_module() -> None:
    code = "from flows.cli.parser import build_parser\nbuild_parser().format_help()\nimport flows.cli"
    assert _loaded_after(code) == set()


def test_board_list_loads_its_area_only() -> None:
    code = "from flows.cli import area_module, build_parser\nbuild_parser().parse_args(['board', 'list'])\n"
    code += "area_module('board')"
    assert _loaded_after(code) == {"flows.cli.board"}


def test_no_command_module_imports_prefect() -> None:
    code = "from flows.cli import area_module\n" + "\n".join(f"area_module({a!r})" for a in AREAS)
    assert not _loaded_after(code) & {"prefect"}
