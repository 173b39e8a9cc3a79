"""The ``loss`` host evaluation reports is the recipe's: built-in losses checked against
``torch.nn.functional`` on real prepared models, custom and embedded losses against the prepared
eval graph run by ONNX Runtime's training API on trained weights."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import EvaluationError
from tasks.judge.evaluate import evaluate, evaluate_cached
from tasks.judge.losses import HostLoss, eval_graph_loss, host_loss
from tasks.judge.runtime import load_test_set, run_model
from tasks.stages.judge import base_model
from tests.fixtures_prepare import RECIPES
from tests.judge.kit import train_a_few_steps
from tests.prepare.kit import TASKS, tiny_recipe


@pytest.fixture(scope="module")
def tiny_prepared(tmp_path_factory: pytest.TempPathFactory):
    """loss kind -> (recipe, prepared, base inference model) of the kit's tiny recipe for that loss."""
    from tasks.prepare.pipeline import prepare

    made: dict = {}

    def get(kind: str):
        if kind not in made:
            folder = tmp_path_factory.mktemp(kind)
            recipe = tiny_recipe(folder, loss=kind)
            prep = prepare(recipe, folder / "prepared", validate=False)
            made[kind] = (recipe, prep, base_model(prep))
        return made[kind]

    return get


@pytest.mark.parametrize("kind", sorted(TASKS))
def test_builtin_loss_matches_torch_and_the_eval_graph(tiny_prepared, kind):
    import torch
    import torch.nn.functional as F

    recipe, prep, model = tiny_prepared(kind)
    m = evaluate(model, recipe.data.test, recipe.task, loss=host_loss(recipe, prep), batch_size=10)
    x, y = load_test_set(recipe.data.test)
    out = torch.from_numpy(run_model(model, x)[0].astype(np.float64))
    target = torch.from_numpy(y if kind == "cross-entropy" else y.astype(np.float64))
    torch_loss = {
        "mse": F.mse_loss,
        "l1": F.l1_loss,
        "bce-with-logits": F.binary_cross_entropy_with_logits,
        "cross-entropy": F.cross_entropy,
    }[kind](out, target)
    assert m["loss_kind"] == kind and m["loss"] == pytest.approx(torch_loss.item(), rel=1e-5)
    # the same number the board's eval step computes for these weights
    arrays = {name: {"x": x, "y": y}[key] for name, key in prep.manifest["feeds"].items()}
    graph = eval_graph_loss(prep.artifacts_dir / "eval_model.onnx", model, arrays)
    assert m["loss"] == pytest.approx(graph, rel=1e-5)
    assert ("accuracy" in m) == (recipe.task != "regression") and ("mae" in m) == (
        recipe.task == "regression"
    )


def test_l1_recipe_reports_the_l1_loss_not_the_mse(tiny_prepared, tmp_path):
    recipe, prep, model = tiny_prepared("l1")
    loss = host_loss(recipe, prep)
    m = evaluate(model, recipe.data.test, recipe.task, loss=loss)
    assert m["loss_kind"] == "l1" and m["loss"] == m["mae"]
    assert m["loss"] != pytest.approx(m["mse"], rel=1e-3)  # what the evaluation reported before
    default = evaluate(model, recipe.data.test, recipe.task)
    assert default["loss_kind"] == "mse" and default["loss"] == m["mse"]
    cached = evaluate_cached(model, recipe.data.test, recipe.task, tmp_path, loss)
    assert cached["loss"] == m["loss"]
    assert evaluate_cached(model, recipe.data.test, recipe.task, tmp_path)["loss"] == m["mse"]
    assert len(list(tmp_path.glob("*.json"))) == 2  # one entry per loss


@pytest.mark.parametrize(
    ("fixture", "recipe_file"),
    [("prepared_embedded", "embedded_loss.toml"), ("prepared_two_head", "two_head_custom_loss.toml")],
)
def test_graph_loss_is_the_eval_graphs_on_the_evaluated_weights(request, tmp_path, fixture, recipe_file):
    from tasks.recipe.load import load_recipe

    prep, recipe = request.getfixturevalue(fixture), load_recipe(RECIPES / recipe_file)
    expected = train_a_few_steps(prep, recipe, tmp_path / "trained.onnx")
    loss = host_loss(recipe, prep)
    m = evaluate(tmp_path / "trained.onnx", recipe.data.test, recipe.task, loss=loss, batch_size=50)
    assert m["loss_kind"] == recipe.loss.kind and m["loss"] == pytest.approx(expected, rel=1e-5)
    assert ("accuracy" in m) == (recipe.task == "classification")  # task metrics stay beside the loss
    base = evaluate(base_model(prep), recipe.data.test, recipe.task, loss=loss)
    assert base["loss"] != pytest.approx(
        m["loss"], rel=1e-3
    )  # the evaluated model's weights, not the checkpoint's


def test_bad_losses_name_what_is_wrong(prepared_two_head, tmp_path):
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(RECIPES / "two_head_custom_loss.toml")
    with pytest.raises(EvaluationError, match="expected one of mse, cross-entropy"):
        HostLoss("huber")
    with pytest.raises(EvaluationError, match="needs the eval graph"):
        HostLoss("custom")
    eval_model = prepared_two_head.artifacts_dir / "eval_model.onnx"
    model, test = base_model(prepared_two_head), RECIPES / "data" / "two_head" / "test.npz"
    with pytest.raises(EvaluationError, match=r"no value for its inputs \['labels', 'target'\]"):
        evaluate(model, test, "classification", loss=HostLoss("custom", eval_model, {"input": "x"}))
    with np.load(test) as data:
        np.savez(tmp_path / "no_aux.npz", x=data["x"], y=data["y"])
    with pytest.raises(EvaluationError, match="expected an array 'aux'"):
        evaluate(model, tmp_path / "no_aux.npz", "classification", loss=host_loss(recipe, prepared_two_head))
    with pytest.raises(EvaluationError, match="task 'embedded': its loss is the eval graph's"):
        evaluate(model, test, "embedded")
