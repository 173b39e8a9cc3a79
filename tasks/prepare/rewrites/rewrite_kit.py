"""Shared tools of the graph rewrites that replace one node by the operators it is made of: a
builder for the new nodes and constants, the value of a tensor computed from constants, and the
check that a rewrite computes what the node computes (run both in ONNX Runtime on random data)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from tasks.prepare.graph import add_const, downstream, observed_shapes, quiet_session, rebuild


class Builder:
    """Nodes and constants of one rewrite, named under the original node's name."""

    def __init__(self, model: onnx.ModelProto, node: onnx.NodeProto):
        self.model, self.prefix, self.nodes, self.count = (
            model,
            f"{node.name or node.output[0]}/decomposed",
            [],
            0,
        )
        self.consts: dict[str, np.ndarray] = {}

    def const(self, name: str, value: object, dtype: type = np.float32) -> str:
        self.consts[f"{self.prefix}/{name}"] = np.asarray(value, dtype)
        return f"{self.prefix}/{name}"

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        self.count += 1
        out = out or f"{self.prefix}/{op_type}_{self.count}"
        self.nodes.append(
            helper.make_node(op_type, inputs, [out], name=f"{self.prefix}/{op_type}_{self.count}", **attrs)
        )
        return out


def static_value(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of a tensor computed from initializers and constants alone (None if it is not)."""

    inits = {i.name: i for i in model.graph.initializer}
    if name in inits:
        return onnx.numpy_helper.to_array(inits[name])
    prelude, reads = constants_prelude(model, [name])
    if not any(name in n.output for n in prelude):
        return None
    graph = helper.make_graph(prelude, "value", [], [helper.make_empty_tensor_value_info(name)],
                              [inits[k] for k in reads if k in inits])  # fmt: skip
    value = helper.make_model(graph, opset_imports=list(model.opset_import))
    value.ir_version = model.ir_version
    sess = quiet_session(value)
    return sess.run([name], {})[0]


def constants_prelude(
    model: onnx.ModelProto, names: list[str], given: frozenset[str] = frozenset()
) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes computing ``names`` from initializers and constants alone (graph order), and the
    initializers they read: what a check graph needs to give those inputs their real values."""
    static = {i.name for i in model.graph.initializer} | {""} | set(given)
    producer = {}
    for node in model.graph.node:
        if all(i in static for i in node.input):
            static.update(node.output)
            producer.update({o: node for o in node.output})
    wanted, todo = set(), [n for n in names if n in producer]
    while todo:
        node = producer[todo.pop()]
        if node.output[0] not in wanted:
            wanted.add(node.output[0])
            todo += [i for i in node.input if i in producer]
    nodes = [n for n in model.graph.node if n.output and n.output[0] in wanted]
    return nodes, {i for n in nodes for i in n.input} | set(names)


def same_values(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    b: Builder,
    shapes: dict[str, list[int]],
    *,
    batch_first: bool = True,
) -> bool:
    """True when the rewrite computes what ``node`` computes on random data (batch 2, or the measured
    shape when the batch is not the first axis) for its data input (the first); its other inputs
    take their real values from constants and that input."""
    inits = {i.name: i for i in model.graph.initializer}
    x, shape = node.input[0], shapes.get(node.input[0], [])
    if not shape or min(shape[1:], default=1) <= 0 or (not batch_first and shape[0] <= 0):
        return False
    dims = [2, *shape[1:]] if batch_first else shape
    feeds = {x: np.random.default_rng(0).standard_normal(dims).astype(np.float32)}
    # the other inputs (a slope, a scale, pads, output sizes) from constants and the data input;
    # with measured shapes (batch_first False), data-dependent ones (an LSTM's zero initial state)
    # are random of their measured shape too
    prelude, reads = constants_prelude(model, [i for i in node.input[1:] if i], frozenset({x}))
    made = {o for n in prelude for o in n.output}
    for name in [i for i in node.input[1:] if i and i not in inits and i not in made]:
        other = shapes.get(name, [])
        if batch_first or not other or min(other) <= 0:
            return False
        feeds[name] = np.random.default_rng(1).standard_normal(other).astype(np.float32)
    outs = []
    for nodes, extra in (([node], {}), (b.nodes, b.consts)):
        graph = helper.make_graph(
            [*prelude, *nodes], "check",
            [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape) for k, v in feeds.items()],
            [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
            [inits[k] for k in reads if k in inits] + [onnx.numpy_helper.from_array(v, k) for k, v in extra.items()],
        )  # fmt: skip
        check = helper.make_model(graph, opset_imports=list(model.opset_import))
        check.ir_version = model.ir_version
        try:
            sess = quiet_session(check)
            outs.append(sess.run(None, feeds)[0])
        except Exception:  # noqa: BLE001 - a rewrite ORT cannot run is not made
            return False
    return outs[0].shape == outs[1].shape and bool(np.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5))


def apply_rewrites(
    model: onnx.ModelProto, indices: list[int], rewrite: Callable[[onnx.NodeProto], Builder | None]
) -> int:
    """Replace each node at ``indices`` by the nodes ``rewrite`` built for it (its constants added to
    the model); a node it returns None for stays. Returns how many were replaced."""
    replace = {}
    for i in indices:
        b = rewrite(model.graph.node[i])
        if b is not None:
            replace[i] = b.nodes
            for name, value in b.consts.items():
                add_const(model, name, value)
    rebuild(model, replace)
    return len(replace)


Rewrite = Callable[[onnx.ModelProto, onnx.NodeProto, dict[str, list[int]]], Builder | None]


def rewrite_each(
    model: onnx.ModelProto,
    op_types: set[str],
    rewrite: Rewrite,
    trainable: list[str] | None = None,
    *,
    any_input: bool = False,
) -> int:
    """Rewrite the nodes of ``op_types``, each by ``rewrite(model, node, observed shapes)``; return
    how many were replaced. With ``trainable``, only nodes on the gradient path: those whose data
    input (or, ``any_input``, any input: a weight too) depends on a trainable tensor."""
    needs = downstream(model, set(trainable)) if trainable is not None else None

    def chosen(node: onnx.NodeProto) -> bool:
        if needs is None:
            return True
        return any(x in needs for x in node.input if x) if any_input else node.input[0] in needs

    todo = [i for i, n in enumerate(model.graph.node) if n.op_type in op_types and chosen(n)]
    if not todo:
        return 0
    shapes = observed_shapes(model)
    return apply_rewrites(model, todo, lambda node: rewrite(model, node, shapes))
