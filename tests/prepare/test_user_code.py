"""An exception inside the user's own model code is reported as the user's code failing, at the
file:line of the innermost frame in the recipe folder, not as a recipe field."""

from __future__ import annotations

import pytest

from tasks.errors import ModelError, RecipeError
from tasks.prepare.pipeline import prepare
from tests.prepare.kit import merge, tiny_recipe

USER_MODULE = """
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes=3, width=4):
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3, padding=1)
        self.fc = nn.Linear(width * 16, num_classes)

    def forward(self, x, labels):
        logits = self.fc(torch.flatten(torch.relu(self.conv(x)), 1))
        return F.cross_entropy(logits, labels.int()), logits  # int32 targets: torch refuses


class Narrow(Net):
    def forward(self, x, labels):
        logits = self.fc(torch.flatten(torch.relu(self.conv(x)), 1))
        return F.cross_entropy(logits, labels), logits.view(-1, 99)  # 2 x 3 logits are no [-1, 99]


class Broken(Net):
    def __init__(self, num_classes=3):
        super().__init__(num_classes, width=4 % "2")


def int32_loss(num_classes=3):
    return Net(num_classes)


def broken(num_classes=3):
    return Broken(num_classes)


def narrow(num_classes=3):
    return Narrow(num_classes)


def fixed_head(**options):
    return Net(num_classes=3, **options)


def no_classes(width=4):
    return Net(3, width)
"""

EMBEDDED = {
    "task": "embedded",
    "loss": {"kind": "embedded"},
    "model": {"input_names": ["input", "labels"], "output_names": ["loss", "logits"]},
    "data": {"feeds": {"input": "x", "labels": "y"}},
}


def _recipe(tmp_path, callable_, changes=None):
    recipe = tiny_recipe(tmp_path, merge({"model": {"callable": f"usercode:{callable_}"}}, changes or {}))
    (tmp_path / "usercode.py").write_text(USER_MODULE)
    return recipe


def _line_of(text: str) -> int:
    return next(n for n, line in enumerate(USER_MODULE.splitlines(), 1) if text in line)


def test_a_dtype_error_in_the_models_forward_names_the_users_line_not_the_input_shape(tmp_path):
    with pytest.raises(ModelError) as err:
        prepare(_recipe(tmp_path, "int32_loss", EMBEDDED), tmp_path / "out")
    assert str(err.value) == (
        f"the model's code raised RuntimeError at usercode.py:{_line_of('labels.int()')} (in forward) on 2 "
        "samples of data.train: expected target dtype to be Long or Byte, but got Int"
    )
    assert "input_shape" not in str(err.value)


def test_a_shape_error_in_the_models_forward_names_the_users_line_and_the_input_shape(tmp_path):
    with pytest.raises(ModelError) as err:
        prepare(_recipe(tmp_path, "narrow", EMBEDDED), tmp_path / "out")
    assert str(err.value).startswith(
        f"the model's code raised RuntimeError at usercode.py:{_line_of('view(-1, 99)')} (in forward) on 2 "
        "samples of data.train of shape [1, 4, 4] (model.input_shape): shape '[-1, 99]' is invalid"
    ), err.value


def test_an_exception_while_building_the_model_names_the_users_line(tmp_path):
    with pytest.raises(
        ModelError, match=r"usercode.py:\d+ \(in __init__\) building the model: unsupported operand"
    ):
        prepare(_recipe(tmp_path, "broken"), tmp_path / "out")


def test_arguments_the_callable_does_not_take_stay_a_recipe_error(tmp_path):
    with pytest.raises(RecipeError, match="model.kwargs"):
        prepare(_recipe(tmp_path, "int32_loss", {"model": {"kwargs": {"depth": 3}}}), tmp_path / "out")


def test_a_builder_without_a_num_classes_parameter_is_built_without_it(tmp_path):
    """model.num_classes is passed only to a builder that takes it (a parameter or **kwargs)."""
    from tasks.prepare.export.torch_model import build_model

    model = build_model(_recipe(tmp_path, "no_classes", {"model": {"kwargs": {"width": 2}}}))
    assert model.fc.out_features == 3 and model.conv.out_channels == 2


def test_a_builder_that_sets_its_own_num_classes_names_the_recipe_key(tmp_path):
    """The issue's case: "multiple values for keyword argument 'num_classes'" was blamed on the
    user's code; the error names model.num_classes and what to change."""
    from tasks.prepare.export.torch_model import build_model

    with pytest.raises(RecipeError) as err:
        build_model(_recipe(tmp_path, "fixed_head"))
    text = str(err.value)
    assert text.startswith("recipe field 'model.num_classes': expected a builder that takes num_classes")
    assert "usercode:fixed_head receives num_classes=3 from model.num_classes through its **kwargs" in text
    assert "multiple values for keyword argument 'num_classes'" in text
