"""mkdocs hook: the repository's own Markdown files that belong in the manual, served from where they
live (no copy that could drift): the benchmarks' figures, the multi-host guide and the agent's README."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = {
    "bench.md": ROOT / "bench" / "README.md",
    "multihost.md": ROOT / "deploy" / "MULTIHOST.md",
    "device_agent.md": ROOT / "device_agent" / "README.md",
}


def on_files(files, config):  # noqa: ANN001, ANN201 - mkdocs' hook signature
    for uri, path in OUTSIDE.items():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
