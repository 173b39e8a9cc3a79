"""Fixtures of the runtimes area: the digits recipe prepared for the autograd runtime in a process
tree where ``onnxruntime.training`` cannot be imported, and an agent run of it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT
from tasks.prepare import Prepared
from tasks.prepare.manifest import file_entry
from tasks.prepare.runtimes.autograd.build import optimizer
from tasks.recipe.load import load_recipe
from tests.fixtures_prepare import RECIPES
from tests.runtimes.kit import prepared_by_odl

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


@pytest.fixture(scope="session")
def autograd_digits(tmp_path_factory: pytest.TempPathFactory, no_ort_training: dict[str, str]):
    """recipes/digits.toml prepared (export, artifacts, validation) for the autograd runtime by
    ``odl prepare`` with onnxruntime.training blocked: (recipe, Prepared)."""
    out: Path = tmp_path_factory.mktemp("autograd_digits") / "prepared"
    return prepared_by_odl(RECIPES / "digits.toml", {"training.runtime": '"autograd"'}, out, no_ort_training)


@pytest.fixture(scope="session")
def autograd_digits_momentum(tmp_path_factory: pytest.TempPathFactory, autograd_digits):
    """The prepared autograd digits with SGD and Nesterov momentum (which only this runtime has):
    the same step graphs, each ``step.json``'s optimizer (the full steps' and the frozen-prefix
    split's) the one the momentum recipe prepares (the graphs do not depend on the optimizer; a
    second ``odl prepare`` would add ~25 s): (recipe, Prepared)."""
    recipe = load_recipe(RECIPES / "digits.toml", {"training.runtime": "autograd", "optimizer.kind": "sgd",
                         "optimizer.lr": 0.05, "optimizer.momentum": 0.9, "optimizer.nesterov": True})  # fmt: skip
    out: Path = tmp_path_factory.mktemp("autograd_digits_momentum") / "prepared"
    shutil.copytree(autograd_digits[1].out_dir, out)
    manifest = json.loads((out / "manifest.json").read_text())
    for entries in (manifest["files"], manifest["prefix_cache"].get("files", {})):
        if "step" in entries:
            step = out / entries["step"]["path"]
            step.write_text(
                json.dumps({**json.loads(step.read_text()), "optimizer": optimizer(recipe)}, indent=2)
            )
            entries["step"] = file_entry(step, entries["step"]["path"])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return recipe, Prepared.of(out, manifest, autograd_digits[1].validation)


@pytest.fixture
def traced_steps(monkeypatch):
    """The autograd runtime's steps traced by ``make_fx``, as for a model whose exported graph has an
    operator without an ONNX gradient rule (:mod:`tasks.prepare.runtimes.autograd.graph_step`)."""
    from tasks.prepare.runtimes.autograd import steps

    def refuse(*args, **kwargs):
        raise steps.Unsupported("this test traces the steps")

    monkeypatch.setattr(steps, "graph_step", refuse)
