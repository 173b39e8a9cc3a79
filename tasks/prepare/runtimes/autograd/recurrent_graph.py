"""A small builder of ONNX nodes for :mod:`.recurrent_onnx`'s expansions: :class:`Graph` names
new nodes under one prefix and writes constants as Constant nodes (which a Scan's body may hold,
unlike initializers); :func:`scan` writes a ``Scan`` over time whose body a function builds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
from onnx import TensorProto, helper


class Graph:
    """New nodes under one prefix, for one placeholder's expansion (or a Scan body)."""

    def __init__(self, prefix: str, opset: int):
        self.prefix, self.opset, self.nodes, self.count = prefix, opset, [], 0

    def name(self, what: str) -> str:
        self.count += 1
        return f"{self.prefix}/{what}_{self.count}"

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs: Any) -> Any:
        names = [self.name(op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type), **attrs))
        return names[0] if outputs == 1 else names

    def ints(self, values: list[int]) -> str:
        name = self.name("const")
        self.nodes.append(helper.make_node("Constant", [], [name], name=name,
                                           value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values)))  # fmt: skip
        return name

    def scalar(self, value: float) -> str:
        name = self.name("const")
        self.nodes.append(helper.make_node("Constant", [], [name], name=name,
                                           value=helper.make_tensor(name, TensorProto.FLOAT, [], [value])))  # fmt: skip
        return name

    def split(self, x: str, parts: int, axis: int) -> list[str]:
        if parts == 1:
            return [x]
        attrs = {"num_outputs": parts} if self.opset >= 18 else {}
        return self.op("Split", [x], parts, axis=axis, **attrs)

    def concat(self, xs: list[str], axis: int) -> str:
        return xs[0] if len(xs) == 1 else self.op("Concat", xs, axis=axis)

    def one_minus(self, x: str) -> str:
        return self.op("Sub", [self.scalar(1.0), x])

    def mul(self, *xs: str) -> str:
        out = xs[0]
        for x in xs[1:]:
            out = self.op("Mul", [out, x])
        return out

    def sigmoid_slope(self, s: str) -> str:
        return self.mul(s, self.one_minus(s))

    def tanh_slope(self, t: str) -> str:
        return self.one_minus(self.mul(t, t))


def body(opset: int, name: str, states: list[str], slices: list[str], build: Callable[[Graph], tuple[list[str], list[str]]]) -> onnx.GraphProto:  # fmt: skip
    """A Scan body: ``states`` then per-step ``slices`` as inputs; ``build`` gives (new states,
    per-step outputs) from its graph, whose inputs are named as given."""
    graph = Graph(name, opset)
    new_states, outs = build(graph)
    outputs = [graph.op("Identity", [v]) for v in new_states + outs]  # a body output is its own value
    float_info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, None)  # noqa: E731
    return helper.make_graph(graph.nodes, name, [float_info(n) for n in states + slices],
                             [float_info(n) for n in outputs])  # fmt: skip


def scan(g: Graph, states: list[str], slices: list[str], reverse: bool, outputs: int,
          build: Callable[[Graph, list[str], list[str]], tuple[list[str], list[str]]]) -> list[str]:  # fmt: skip
    """A Scan over the first axis of ``slices`` (``reverse``: from the last step), its outputs
    stacked in step order; returns the final states then the stacked outputs."""
    prefix = g.name("scan")
    state_in = [f"{prefix}/state{k}" for k in range(len(states))]
    slice_in = [f"{prefix}/step{k}" for k in range(len(slices))]
    body_graph = body(g.opset, prefix, state_in, slice_in, lambda b: build(b, state_in, slice_in))
    direction = [1 if reverse else 0]
    result = g.op("Scan", [*states, *slices], len(states) + outputs, body=body_graph, num_scan_inputs=len(slices),
                  scan_input_directions=direction * len(slices), scan_output_directions=direction * outputs)  # fmt: skip
    return result if isinstance(result, list) else [result]
