"""Equal where both run: reference recipes with an embedded loss (SGD) and a custom loss (AdamW,
through its PyTorch twin) train 50 agent steps under the autograd runtime, prepared and run with
``onnxruntime.training`` unimportable, with the ORT runtime's per-step losses (1e-4 relative) and
final weights (1e-4)."""

from __future__ import annotations

import json
from dataclasses import replace

import onnx
import pytest
import torch

from tasks.prepare.board_job import build_job_spec
from tasks.prepare.export.torch_model import build_model
from tasks.prepare.runtimes.autograd.build import exported_weights
from tasks.recipe.load import load_recipe
from tests.fixtures_prepare import RECIPES
from tests.runtimes.kit import assert_trained_alike, prepared_by_odl, run_job

STEPS = 50
RECIPE_FIXTURES = {
    "embedded_loss.toml": "prepared_embedded",
    "two_head_custom_loss.toml": "prepared_two_head",
}


@pytest.mark.slow
@pytest.mark.ort_training  # the ORT runtime's preparations (RECIPE_FIXTURES) are its reference
@pytest.mark.parametrize("recipe_file", list(RECIPE_FIXTURES))
def test_fifty_steps_equal_the_ort_runtime_s(request, tmp_path, agent_board, no_ort_training, recipe_file):
    ort_prepared = request.getfixturevalue(RECIPE_FIXTURES[recipe_file])
    weights = tmp_path / "ort_export.pt"  # both start from the ORT export's weights (a random init differs)
    torch.save(
        exported_weights(
            build_model(load_recipe(RECIPES / recipe_file)), onnx.load(ort_prepared.model_onnx)
        ).state_dict(),
        weights,
    )
    overrides = {"training.runtime": '"autograd"', "model.weights": json.dumps(str(weights))}
    recipe, prepared = prepared_by_odl(
        RECIPES / recipe_file, overrides, tmp_path / "autograd", no_ort_training
    )
    assert prepared.manifest["feeds"] == ort_prepared.manifest["feeds"]
    assert prepared.manifest["inference_output_names"] == ort_prepared.manifest["inference_output_names"]
    jobs = {}
    for name, prep, env in (("autograd", prepared, no_ort_training), ("ort", ort_prepared, None)):
        spec, files = build_job_spec(recipe, prep, name)
        spec = replace(spec, train=replace(spec.train, max_steps=STEPS, log_every=1))
        jobs[name] = run_job(agent_board, spec, files, env=env)[0]
    assert_trained_alike(jobs["autograd"], jobs["ort"], STEPS)
