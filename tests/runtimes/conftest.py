"""Fixtures of the runtimes area: the digits recipe prepared for the autograd runtime in a process
tree where ``onnxruntime.training`` cannot be imported, and an agent run of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT
from tests.fixtures_prepare import RECIPES

AUTOGRAD = 'training.runtime="autograd"'
# installed as sitecustomize.py first on PYTHONPATH: every Python process of the tree (odl, the
# training probe, the graph-running child, the agent) refuses onnxruntime.training, and says so
BLOCKER = '''
import sys

class _NoOrtTraining:
    """Refuses onnxruntime.training and everything below it."""

    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime.training" or name.startswith("onnxruntime.training."):
            raise ImportError(f"onnxruntime.training is blocked in this process tree ({name})")
        return None

sys.meta_path.insert(0, _NoOrtTraining())
'''


@pytest.fixture(scope="session")
def no_ort_training(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process tree that cannot import ``onnxruntime.training``."""
    folder = tmp_path_factory.mktemp("no-ort-training")
    (folder / "sitecustomize.py").write_text(BLOCKER)
    return {"PYTHONPATH": os.pathsep.join([str(folder), str(PROJECT_ROOT)])}


def odl(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    """``python -m flows.cli ARGS`` (the ``odl`` command) with ``env`` added to this one's."""
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env={**os.environ, **env}, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="session")
def autograd_digits(tmp_path_factory: pytest.TempPathFactory, no_ort_training: dict[str, str]):
    """recipes/digits.toml prepared (export, artifacts, validation) for the autograd runtime by
    ``odl prepare`` with onnxruntime.training blocked: (recipe, Prepared)."""
    from tasks.prepare import Prepared
    from tasks.recipe.load import load_recipe

    out: Path = tmp_path_factory.mktemp("autograd_digits") / "prepared"
    proc = odl(
        ["prepare", str(RECIPES / "digits.toml"), "--set", AUTOGRAD, "--out", str(out)], no_ort_training
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    validation = json.loads((out / "validation.json").read_text())
    recipe = load_recipe(RECIPES / "digits.toml", {"training.runtime": "autograd"})
    return recipe, Prepared.of(out, manifest, validation)
