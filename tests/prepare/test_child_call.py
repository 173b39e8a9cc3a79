"""One call of preparation in a fresh child (tasks.prepare.sandbox.child_call): its value comes back, its
error comes back as the same class with its attributes, and a death by signal is one line naming
the signal and what the call was doing; the judging rehearsal runs that way."""

from __future__ import annotations

import json
import math
import signal

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tasks.errors import ModelError, RecipeError, ValidationFailed
from tasks.exits import Interrupted
from tasks.prepare.pipeline import prepare
from tasks.prepare.sandbox.child_call import call_in_child
from tasks.recipe.load import load_recipe
from tasks.stages.rehearse import rehearse_judging
from tests.prepare.kit import tiny_recipe


def _error(line: str) -> ModelError:
    return ModelError(line)


def test_the_value_comes_back():
    assert call_in_child("math:hypot", 3.0, 4.0, what="a hypotenuse", error=_error) == 5.0
    assert call_in_child("json:loads", '{"a": [1]}', what="json", error=_error) == json.loads('{"a": [1]}')


def test_an_error_comes_back_as_its_class_with_its_fields(tmp_path):
    with pytest.raises(ValueError, match="math domain error"):
        call_in_child("math:sqrt", -1.0, what="a root", error=_error)
    (tmp_path / "bad.toml").write_text('task = "poetry"\n')
    with pytest.raises(RecipeError) as err:
        call_in_child("tasks.recipe.load:load_recipe", tmp_path / "bad.toml", what="loading", error=_error)
    with pytest.raises(RecipeError) as here:
        load_recipe(tmp_path / "bad.toml")
    assert (err.value.field, str(err.value), err.value.exit_code) == (
        here.value.field,
        str(here.value),
        here.value.exit_code,
    )


@pytest.mark.parametrize(("target", "name"), [("os:abort", "SIGABRT"), ("faulthandler:_sigsegv", "SIGSEGV")])
def test_a_death_by_signal_is_one_line_naming_it_and_the_work(target, name):
    with pytest.raises(ModelError) as err:
        call_in_child(target, what="the test's call", error=_error)
    text = str(err.value)
    assert text.startswith(f"the test's call died of {name}") and "\n" not in text, text


def test_an_exit_without_an_answer_names_its_status_and_last_words():
    with pytest.raises(ModelError) as err:
        call_in_child("sys:exit", "no answer today", what="the test's call", error=_error)
    assert str(err.value) == "the test's call ended with exit status 1 (its last words: no answer today)"


def test_a_stop_signal_that_ends_the_child_stops_like_ctrl_c():
    with pytest.raises(Interrupted):
        call_in_child("signal:raise_signal", signal.SIGTERM, what="stopping", error=_error)


def _dividing_by_zero(model: onnx.ModelProto) -> onnx.ModelProto:
    """A linear model with ``model``'s input and first output whose logits add ``sum(x) // 0`` in
    int64: ONNX Runtime dies of SIGFPE on any input."""
    x, out = model.graph.input[0], model.graph.output[0]
    features = math.prod(d.dim_value for d in x.type.tensor_type.shape.dim[1:])
    classes = out.type.tensor_type.shape.dim[1].dim_value
    nodes = [
        helper.make_node("Flatten", [x.name], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        helper.make_node("ReduceSum", [x.name], ["total"], keepdims=0),
        helper.make_node("Cast", ["total"], ["total_i"], to=TensorProto.INT64),
        helper.make_node("Div", ["total_i", "zero"], ["ratio"]),
        helper.make_node("Cast", ["ratio"], ["ratio_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["logits", "ratio_f"], [out.name]),
    ]
    weights = [onnx.numpy_helper.from_array(np.ones((features, classes), np.float32), "w"),
               onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")]  # fmt: skip
    graph = helper.make_graph(nodes, "divides_by_zero", [x], [out], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_rehearsal_that_kills_onnx_runtime_is_the_host_evaluation_check(tmp_path):
    """The probe's model dies of SIGFPE when the judge evaluates it: one line of the
    ``host_evaluation`` check, and the test process lives on."""
    recipe = tiny_recipe(tmp_path)
    prep = prepare(recipe, tmp_path / "out")
    path = prep.out_dir / "validation_inference.onnx"
    onnx.save(_dividing_by_zero(onnx.load(str(path))), str(path))
    with pytest.raises(ValidationFailed) as err:
        rehearse_judging(recipe, prep)
    assert err.value.check == "host_evaluation" and "\n" not in str(err.value)
    assert "the judging rehearsal" in str(err.value) and "died of SIGFPE" in str(err.value), err.value


def test_after_a_death_the_next_call_gets_a_new_child_working_in_the_callers_folder(tmp_path, monkeypatch):
    first = call_in_child("os:getpid", what="a pid", error=_error)
    assert call_in_child("os:getpid", what="a pid", error=_error) == first  # one child serves the calls
    with pytest.raises(ModelError, match="SIGABRT"):
        call_in_child("os:abort", what="the test's call", error=_error)
    monkeypatch.chdir(tmp_path)
    assert call_in_child("os:getcwd", what="a folder", error=_error) == str(tmp_path)
    assert call_in_child("os:getpid", what="a pid", error=_error) != first
