"""Where the pipeline keeps its local state (runs, boards, registry, Prefect home, caches)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def odl_home() -> Path:
    """The state folder: ``$ODL_HOME``, else ``.odl/`` in the current directory."""
    return Path(os.environ.get("ODL_HOME") or Path.cwd() / ".odl").resolve()


def state_dir(*parts: str) -> Path:
    """A sub-folder of the state folder, created on first use."""
    path = odl_home().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
