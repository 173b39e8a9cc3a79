"""Retrieval's join of the frozen prefix and the trained suffix, rehearsed by validation: a foreign
ONNX whose exporter shares initializers across the cut prepares (the prefix's copies are renamed),
and validation fails a join that retrieval could not make."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tasks.errors import ValidationFailed
from tasks.prepare import prefix
from tasks.prepare.pipeline import prepare
from tasks.recipe.load import load_recipe
from tests.prepare.foreign_kit import shared_initializers, write_foreign


def test_shared_initializers_across_the_cut_are_renamed_in_the_prefix(tmp_path):
    recipe = write_foreign(tmp_path)
    assert shared_initializers(tmp_path / "foreign.onnx")  # the case: one bias tensor for three convs
    done = prepare(load_recipe(recipe), tmp_path / "out")
    join = done.validation["checks"]["join_matches_full"]
    assert join["max_abs_diff"] <= join["tolerance"] and join["samples"] == 8
    assert done.manifest["prefix_cache"]["enabled"]
    assert not list((tmp_path / "out").glob("validation_*base.onnx"))  # the rehearsal's files are gone


def test_validation_fails_a_join_retrieval_could_not_make(tmp_path, monkeypatch):
    recipe = write_foreign(tmp_path)
    monkeypatch.setattr(prefix, "rename_shared", lambda *a, **k: 0)
    with pytest.raises(
        ValidationFailed, match="join_matches_full.*overlapping names.*prefix_cache = 'off'"
    ) as err:
        prepare(load_recipe(recipe), tmp_path / "out")
    assert "\n" not in str(err.value)


def test_rename_shared_keeps_the_cut_and_the_inputs():
    p = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "c"], ["cut"], name="n")], "p",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("cut", onnx.TensorProto.FLOAT, [1])],
        [onnx.numpy_helper.from_array(np.zeros(1, np.float32), "c")],
    )  # fmt: skip
    s = onnx.helper.make_graph(
        [onnx.helper.make_node("Mul", ["cut", "c"], ["y"], name="n")], "s",
        [onnx.helper.make_tensor_value_info("cut", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        [onnx.numpy_helper.from_array(np.zeros(1, np.float32), "c")],
    )  # fmt: skip
    assert prefix.rename_shared(p, s, keep={"cut"}) == 2  # the initializer and the node name
    assert [i.name for i in p.initializer] == ["prefix/c"] and list(p.node[0].input) == ["x", "prefix/c"]
    assert list(p.node[0].output) == ["cut"] and p.node[0].name == "prefix/n"
    assert json.dumps([i.name for i in s.initializer]) == '["c"]'
