"""The CLI tests' kit: a user's own folder with a copy of the digits recipe, the environment of an
``odl`` child, and what a run of it left."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tasks.paths import PROJECT_ROOT

RECIPES = PROJECT_ROOT / "recipes"


def user_folder(base: Path, digits_recipe) -> Path:
    """``base/elsewhere``: a copy of the digits recipe (its data shared, made here if missing) with
    its model and data modules; returns ``base/cwd``, a folder beside it to run ``odl`` from."""
    from tasks import stages

    stages.prepare_data(digits_recipe)
    mine = base / "elsewhere"
    mine.mkdir()
    for module in ("models.py", "datasets.py"):
        shutil.copy(RECIPES / module, mine / module)
    (mine / "recipe.toml").write_text(
        (RECIPES / "digits.toml").read_text().replace('"data/', f'"{RECIPES}/data/')
    )
    (base / "cwd").mkdir()
    return base / "cwd"


def odl_env(home: Path, cuda_home: Path) -> dict[str, str]:
    """The environment of an ``odl`` child with ``ODL_HOME=home`` and no Prefect server named;
    CUDA_HOME names a folder so that torch's "No CUDA runtime is found" fires wherever torch's C++
    helpers load."""
    env = os.environ | {"ODL_HOME": str(home), "PYTHONPATH": str(PROJECT_ROOT), "CUDA_HOME": str(cuda_home)}
    for name in ("PREFECT_API_URL", "TORCH_LOGS"):
        env.pop(name, None)
    return env


@dataclass(frozen=True)
class FlowRun:
    """What ``odl flow`` left: its home, exit status and its two streams (pipes, not a terminal)."""

    home: Path
    returncode: int
    stdout: str
    stderr: str
