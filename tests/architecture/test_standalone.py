"""The repository stands alone: no tracked file points to a file outside the checkout (a fresh
clone has nothing beside it), and the README's links to the repository's own files resolve."""

from __future__ import annotations

import re
import subprocess

from tasks.paths import PROJECT_ROOT


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_no_tracked_file_points_outside_the_checkout():
    outside = re.compile(r"\.\./shared\b|\bshared/(?:FACTS|DESIGN|STYLE)\.md")
    found = []
    for name in _tracked():
        path = PROJECT_ROOT / name
        if path.suffix in {".png", ".npz", ".onnx", ".pt"} or not path.is_file():
            continue
        text = path.read_text(errors="ignore")
        found += [f"{name}: {m.group(0)}" for m in outside.finditer(text)]
    assert not found, found


def test_the_readme_links_to_files_that_exist():
    readme = (PROJECT_ROOT / "README.md").read_text()
    targets = {t for t in re.findall(r"\]\(([^)#:]+)\)", readme)}
    missing = sorted(t for t in targets if not (PROJECT_ROOT / t).exists())
    assert targets and not missing, missing
