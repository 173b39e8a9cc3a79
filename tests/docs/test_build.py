"""The manual builds: ``mkdocs build --strict`` (what ``make docs`` runs), where a warning, a broken link or
a missing anchor fails; and the README stays a short front page into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tasks.paths import PROJECT_ROOT


def test_mkdocs_build_strict_passes(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")]
    proc = subprocess.run(mkdocs, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "recipe" / "index.html").is_file()


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = (PROJECT_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    first = "\n".join(lines[:15])
    assert re.search(r"^make demo\b", first, re.M) and re.search(r"^make test\b", first, re.M)


def test_every_manual_page_is_in_the_nav() -> None:
    """A page outside the nav is a page nobody finds (mkdocs warns too: omitted_files)."""
    nav = (PROJECT_ROOT / "mkdocs.yml").read_text()
    docs = PROJECT_ROOT / "docs"
    pages = [p.relative_to(docs).as_posix() for p in docs.rglob("*.md")]
    assert pages and all(page in nav for page in pages), [p for p in pages if p not in nav]
