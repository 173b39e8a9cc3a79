"""Where the autograd runtime's step graphs are cut for frozen-prefix caching (prefix_split.cuts):
the latest tensor of the model's inputs alone from which every output follows; a random draw keeps
the cut before it, a trainable tensor acting on the input leaves none, the batch size read from the
input is read from the cut instead."""

from __future__ import annotations

import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from tasks.prepare.runtimes.autograd.prefix_split import CUT, cuts, renamed

F = TensorProto.FLOAT


def _step(nodes, inputs, outputs=("loss",), inits=()):
    graph = helper.make_graph(
        nodes,
        "step",
        [helper.make_tensor_value_info(n, F, None) for n in inputs],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _frozen():
    return numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "frozen")


def test_the_cut_is_the_last_frozen_tensor_before_the_noise_and_the_trainable_weight():
    nodes = [
        helper.make_node("MatMul", ["x", "frozen"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Mul", ["r", "noise"], ["dropped"]),  # a dropout mask: drawn every step
        helper.make_node("MatMul", ["dropped", "w"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    model = _step(nodes, ["x", "w", "noise"], inits=[_frozen()])
    assert list(cuts(model, ["x"], {"w", "noise"})) == ["r", "h"]
    assert list(cuts(model, ["x"], {"w"}))[0] == "dropped"  # without the draw, after the Mul


def test_a_trainable_tensor_on_the_input_leaves_no_cut():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("MatMul", ["h", "frozen"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    assert list(cuts(_step(nodes, ["x", "w"], inits=[_frozen()]), ["x"], {"w"})) == []


def test_two_frozen_tensors_read_by_the_trainable_part_cut_where_both_follow():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("MatMul", ["a", "frozen"], ["b"]),
        helper.make_node("MatMul", ["a", "w"], ["ya"]),
        helper.make_node("MatMul", ["b", "w"], ["yb"]),
        helper.make_node("Add", ["ya", "yb"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    assert list(cuts(_step(nodes, ["x", "w"], inits=[_frozen()]), ["x"], {"w"})) == ["a"]


def test_the_batch_size_read_from_the_input_is_read_from_the_cut():
    nodes = [
        helper.make_node("Shape", ["x"], ["n"], start=0, end=1),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("MatMul", ["r", "w"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0),
        helper.make_node("Cast", ["n"], ["nf"], to=F),
        helper.make_node("Div", ["s", "nf"], ["loss"]),  # a mean over the batch
    ]
    model = _step(nodes, ["x", "w"])
    assert list(cuts(model, ["x"], {"w"})) == ["r"]
    suffix = renamed(model, "r", ["x"])
    assert [list(n.input) for n in suffix.graph.node[:2]] == [[CUT], ["x"]]
    x, w = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32), np.eye(4, dtype=np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(["loss"], {"x": x, "w": w})[0]
    del suffix.graph.node[1]  # the Relu: the suffix reads its output from the cache
    suffix.graph.input[0].name = CUT
    sess = onnxruntime.InferenceSession(suffix.SerializeToString())
    np.testing.assert_allclose(sess.run(["loss"], {CUT: np.maximum(x, 0), "w": w})[0], want, rtol=1e-6)
