"""``odl evaluate`` of keypoints: with the recipe, OKS AP and the keypoints loss of its [keypoints]
table; with ``--task keypoints`` alone, one line asking for the recipe."""

from __future__ import annotations

import json

from flows.cli import main
from tasks.paths import PROJECT_ROOT


def test_evaluate_with_a_keypoints_recipe_reports_oks_ap(flow_home, capsys):
    from tasks import stages
    from tasks.recipe.load import load_recipe
    from tasks.stages.judge import base_model

    path = PROJECT_ROOT / "recipes" / "keypoints.toml"
    recipe = load_recipe(path)
    stages.prepare_data(recipe)
    model = base_model(stages.prepare(stages.inputs(recipe), validate_recipe=False))
    capsys.readouterr()  # a fresh clone's data make prints its base's fit: only evaluate's output below
    assert main(["evaluate", str(model), str(recipe.data.test), "--recipe", str(path)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert (
        metrics["loss_kind"] == "keypoints-mse"
        and 0 <= metrics["oks_ap"] <= 1
        and metrics["output"] == "heatmaps"
    )
    assert (
        main(["evaluate", str(model), str(recipe.data.test), "--task", "keypoints"]) == 51
    )  # a recipe error
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'--recipe': expected the keypoints recipe ([keypoints]" in err[0]
