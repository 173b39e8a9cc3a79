"""A bad teacher is refused by ``odl prepare`` in one line naming the field, before anything reaches
a board (issue 26): a wrong output shape, an opset the board's ONNX Runtime cannot load, a teacher
that does not fit the job's RAM budget with training; and the recipe rules of ``[teacher]``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.fixtures_prepare import RECIPES

RECIPE = RECIPES / "digits_teacher.toml"


def _teacher(path, classes: int, opset: int) -> str:
    """A linear teacher over the flattened 8x8 digit: [N, 1, 8, 8] -> [N, classes]."""
    w = numpy_helper.from_array(
        np.random.default_rng(0).normal(0, 0.1, (64, classes)).astype(np.float32), "w"
    )
    shape = numpy_helper.from_array(np.array([-1, 64], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["input", "shape"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["logits"])],
        "teacher",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        [w, shape],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture(scope="module")
def teacher_data():
    from tasks import stages
    from tasks.recipe.load import load_recipe

    stages.prepare_data(load_recipe(RECIPE))


def _refusal(capsys, tmp_path, *sets: str) -> str:
    from flows.cli import main

    args = ["prepare", str(RECIPE), "--out", str(tmp_path / "prepared")]
    for s in sets:
        args += ["--set", s]
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("odl: error")]
    assert code != 0 and len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("classes", "opset", "says"),
    [
        (7, 17, "teacher.output: the teacher answers [197, 7] for 197 test samples; expected [N, 10]"),
        (
            10,
            22,
            "teacher.model: bad.onnx uses opset 22; the board's ONNX Runtime 1.19.2 loads opsets up to 21",
        ),
    ],
)
def test_a_bad_teacher_model_is_refused_in_one_line(teacher_data, capsys, tmp_path, classes, opset, says):
    path = _teacher(tmp_path / "bad.onnx", classes, opset)
    line = _refusal(capsys, tmp_path, f"teacher.model={path}")
    assert says in line


def test_a_teacher_over_the_ram_budget_is_refused(teacher_data, capsys, tmp_path):
    """Training alone (~95 MB) fits 100 MB; with the reference teacher it does not."""
    line = _refusal(capsys, tmp_path, "teacher.ram_budget_mb=100.0")
    assert "teacher.ram_budget_mb: the teacher needs ~" in line and "> the budget 100 MB" in line


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        ({"teacher.labels": "soft"}, "loss.kind"),  # soft labels need the distillation loss
        ({"loss.kind": "distillation"}, "loss.kind"),  # distillation needs soft labels
        (
            {"teacher.balance_cap": 5, "teacher.labels": "soft", "loss.kind": "distillation"},
            "teacher.balance_cap",
        ),
        ({"teacher.threshold": 1.5}, "teacher.threshold"),
        ({"teacher.temperature": 0.0}, "teacher.temperature"),
        ({"teacher.model": "teacher.pt"}, "teacher.model"),
        ({"teacher.scores": "raw"}, "teacher.scores"),
    ],
)
def test_teacher_recipe_rules_name_the_field(sets, field):
    from tasks.errors import RecipeError
    from tasks.recipe.load import load_recipe

    with pytest.raises(RecipeError) as err:
        load_recipe(RECIPE, sets)
    assert field in str(err.value)


def test_unlabeled_shards_without_a_teacher_are_refused_before_the_board(tmp_path):
    from tasks.errors import DataError
    from tasks.judge.registry import Registry
    from tasks.nightly.board_data import board_data
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(RECIPES / "digits_nightly.toml")  # labeled shards expected: no [teacher]
    listing = {"path": "/b/datasets/digits", "files": [
        {"name": "shard-0001.npz", "sha256": "a" * 64, "size": 10, "samples": 250, "arrays": ["x"]}]}  # fmt: skip
    with pytest.raises(DataError, match=r"shard-0001.npz on b1 has no 'y' array .* add a \[teacher\] table"):
        board_data(recipe, "b1", listing, Registry(tmp_path))
