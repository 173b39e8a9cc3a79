"""Models nobody tuned for, through the whole flow (prepare, board, retrieval, evaluation): a
hand-written CNN whose frozen BatchNorm meets ``F.avg_pool2d(x, 4)``, and a foreign ONNX file whose
initializers are shared across the frozen-prefix cut, joined back with the prefix cache on.
tests/e2e/test_flow_vboard.py runs these on the virtual board."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fixtures_prepare import needs_ort_training
from tests.flow.test_flow import _run
from tests.prepare.foreign_kit import shared_initializers, write_avgpool, write_foreign

pytestmark = pytest.mark.slow


def _manifest(recipe_path, board: str, version: str):
    """The manifest the registry keeps with the run's version (the prepared folder's name hashes the
    preparation code, which may change while the suite runs)."""
    from tasks import stages
    from tasks.recipe.load import load_recipe

    name = load_recipe(recipe_path).name
    found = next(v for v in stages.registry().versions(name, board) if v.name == version)
    return json.loads((found.path / "manifest.json").read_text())


@pytest.mark.vboard
@pytest.mark.parametrize("runtime", ["ort-training", "autograd"])
def test_avg_pool_after_frozen_batchnorm_trains_on_the_board(
    prefect_harness, flow_home, flow_board, tmp_path, runtime
):
    """ORT's training graph takes the pool as a convolution (its fix-up); autograd's step differentiates
    the pool itself."""
    if runtime == "ort-training":
        needs_ort_training()
    recipe = write_avgpool(tmp_path, runtime)
    _, out = _run(flow_board.name, recipe=str(recipe))
    manifest = _manifest(recipe, flow_board.name, out.version)
    pools = manifest["fixups"].get("average_pools_as_convs", 0)
    assert manifest["batchnorm"] == "frozen" and pools == (1 if runtime == "ort-training" else 0)
    base, cand = out.metrics["base"], out.metrics["candidate"]
    assert np.isfinite(cand["loss"]) and cand["loss"] < base["loss"]  # it learned on the board


@pytest.mark.vboard
@pytest.mark.parametrize("runtime", ["ort-training", "autograd"])
def test_foreign_onnx_sharing_initializers_across_the_cut_completes(
    prefect_harness, flow_home, flow_board, tmp_path, runtime
):
    """Under either runtime (autograd differentiates the file's PyTorch twin, onnx2torch, and trains that graph)."""
    if runtime == "ort-training":
        needs_ort_training()
    recipe = write_foreign(tmp_path, runtime)
    assert shared_initializers(tmp_path / "foreign.onnx")
    _, out = _run(flow_board.name, recipe=str(recipe))
    manifest = _manifest(recipe, flow_board.name, out.version)
    assert manifest.get("runtime", "ort-training") == runtime
    assert manifest["prefix_cache"]["enabled"]  # the board trained the split suffix
    assert np.isfinite(out.metrics["candidate"]["loss"])  # the joined model was evaluated
