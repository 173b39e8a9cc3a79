"""``odl evaluate``: the loss it reports is the one asked for, or the recipe's (its eval graph's
for an embedded loss)."""

from __future__ import annotations

import json

import numpy as np

from flows.cli import main
from tasks.paths import PROJECT_ROOT


def test_evaluate_reports_the_loss_asked_for(prepared_digits, tmp_path, capsys):
    from tasks.stages.judge import base_model

    model = base_model(prepared_digits)
    test = PROJECT_ROOT / "recipes" / "data" / "digits" / "test.npz"
    assert main(["evaluate", str(model), str(test), "--loss", "cross-entropy"]) == 0
    assert json.loads(capsys.readouterr().out)["loss_kind"] == "cross-entropy"
    # a loss that does not fit the model's outputs is a one-line evaluation error, not a number
    assert main(["evaluate", str(model), str(test), "--loss", "l1"]) == 65
    assert "odl: error:" in capsys.readouterr().err


def test_evaluate_with_an_embedded_recipe_runs_its_eval_graph(flow_home, prepared_embedded, capsys):
    from tasks.stages.judge import base_model

    recipe = PROJECT_ROOT / "recipes" / "embedded_loss.toml"
    test = PROJECT_ROOT / "recipes" / "data" / "digits" / "test.npz"
    assert main(["evaluate", str(base_model(prepared_embedded)), str(test), "--recipe", str(recipe)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["loss_kind"] == "embedded" and np.isfinite(metrics["loss"])


def test_evaluate_with_a_detector_recipe_reports_coco_map(flow_home, capsys):
    """A recipe with a [detection] table: the model is decoded with the export's priors and
    scored with COCO mAP beside its embedded loss."""
    from tasks import stages
    from tasks.recipe.load import load_recipe

    path = PROJECT_ROOT / "recipes" / "ssdlite_small.toml"
    recipe = load_recipe(path)
    inp = stages.inputs(recipe)
    stages.prepare_data(recipe)
    stages.generate_artifacts(inp)
    model = stages.base_model(stages.prepared(inp))
    assert main(["evaluate", str(model), str(recipe.data.test), "--recipe", str(path)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["loss_kind"] == "embedded" and 0.0 <= metrics["map"] <= metrics["map50"] <= 1.0
    assert set(metrics["per_class_ap50"]) == {"square", "disc", "triangle"}
