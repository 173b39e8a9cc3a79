"""Where the pipeline keeps its local state (runs, boards, registry, Prefect home, caches)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def odl_home() -> Path:
    """The state folder: ``$ODL_HOME``; else, as git finds its repository, the ``.odl/`` of the current
    folder or of the nearest folder above it that has one; else ``.odl/`` in the current folder."""
    if os.environ.get("ODL_HOME"):
        return Path(os.environ["ODL_HOME"]).resolve()
    here = Path.cwd().resolve()
    return next((f / ".odl" for f in (here, *here.parents) if (f / ".odl").is_dir()), here / ".odl")


def home_hint() -> str:
    """How the home was chosen, for an error about what it lacks: ``$ODL_HOME``, or that none was
    found from the current folder up, naming the project's home when it has one."""
    if os.environ.get("ODL_HOME"):
        return f"ODL_HOME={os.environ['ODL_HOME']}"
    home, project = odl_home(), PROJECT_ROOT / ".odl"
    found = home.is_dir()
    where = (
        f"the nearest .odl/ from the current folder up is {home}"
        if found
        else "no .odl/ in the current folder or above"
    )
    other = f"; set ODL_HOME={project} for the project's home" if project.is_dir() and project != home else ""
    return f"ODL_HOME is not set: {where}{other}"


def state_dir(*parts: str) -> Path:
    """A sub-folder of the state folder, created on first use."""
    path = odl_home().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
