"""Reverse-mode differentiation of an ONNX graph, written as more ONNX nodes.

The train step of a model whose every operator on the way from a trainable tensor to the loss has a
gradient rule here (:mod:`.onnx_grad_rules`, :mod:`.onnx_grad_nn`) is its TorchScript export (the
ORT path's own exporter, a fraction of a second) plus the nodes of its backward pass, built in one
walk over the graph in reverse order: no tracer, no symbolic shapes, no second exporter. Each node's
rule is given the gradients of its outputs and writes, in plain ONNX operators a board's inference
build runs, the gradients of its inputs; gradients reaching one tensor from several consumers are
summed. A graph with an operator without a rule is :class:`Unsupported`, and the caller traces the
step instead (:mod:`.steps`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

FLOATS = {TensorProto.FLOAT}
Dim = int | str | None
Rule = Callable[["Builder", Any, list[str | None]], list[str | None]]
RULES: dict[str, Rule] = {}
NOT_DIFFERENTIABLE = {"Shape", "Size", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not",
                      "And", "Or", "ArgMax", "ArgMin", "OneHot", "NonZero", "ConstantOfShape", "Constant",
                      "Range", "Sign", "Floor", "Ceil", "Round", "IsNaN", "IsInf"}  # fmt: skip


class Unsupported(Exception):
    """The graph holds something this differentiation does not handle (the caller traces instead)."""


def rule(*ops: str) -> Callable[[Rule], Rule]:
    """Register a gradient rule for ``ops``."""

    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn

    return register


def attr(node: Any, name: str, default: Any = None) -> Any:
    """An attribute's value (bytes decoded), or ``default``."""
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


class Builder:
    """The backward nodes under construction, with what is known of the forward graph's tensors:
    their shapes (from ONNX shape inference; a dim is an int, a symbol or None) and constant values."""

    def __init__(self, model: Any, shapes: dict[str, list[Dim]], types: dict[str, int],
                 values: dict[str, np.ndarray]) -> None:  # fmt: skip
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.count = itertools.count()
        g = model.graph
        self.shapes: dict[str, list[Dim] | None] = dict(shapes)
        self.types = dict(types)
        self.constants: dict[str, np.ndarray] = dict(values)
        for init in g.initializer:
            self.constants[init.name] = numpy_helper.to_array(init)
            self.types[init.name], self.shapes[init.name] = init.data_type, list(init.dims)
        for node in g.node:
            if node.op_type == "Constant" and attr(node, "value") is not None:
                self.constants[node.output[0]] = numpy_helper.to_array(attr(node, "value"))

    def fresh(self, hint: str) -> str:
        return f"grad/{hint}_{next(self.count)}"

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: Any) -> Any:
        """A backward node; its output name (or names)."""
        outs = [self.fresh(op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=outs[0], **attrs))
        return outs[0] if outputs == 1 else outs

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        name = self.fresh("const")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def ints(self, values: Any) -> str:
        return self.const(values, np.int64)

    def shape(self, name: str) -> list[Dim]:
        """``name``'s inferred shape (Unsupported when its rank is unknown)."""
        shape = self.shapes.get(name)
        if shape is None:
            raise Unsupported(f"the rank of {name} is unknown")
        return shape

    def static(self, name: str, axes: Any = None) -> list[int]:
        """``name``'s sizes along ``axes`` (all when None), each known (else Unsupported)."""
        shape = self.shape(name)
        dims = [shape[a] for a in (range(len(shape)) if axes is None else axes)]
        if not all(isinstance(d, int) and d > 0 for d in dims):
            raise Unsupported(f"the sizes of {name} along {axes} are not known")
        return dims  # type: ignore[return-value]

    def constant(self, name: str) -> np.ndarray:
        """A constant input's value (Unsupported when it is computed)."""
        if name not in self.constants:
            raise Unsupported(f"{name} is not a constant")
        return self.constants[name]

    def unbroadcast(self, grad: str, x: str, y: str) -> str:
        """``grad`` (shaped as ``y``, which broadcast ``x``) summed back to ``x``'s shape."""
        xs, ys = self.shape(x), self.shape(y)
        lead = len(ys) - len(xs)
        axes = list(range(lead)) + [lead + i for i, d in enumerate(xs) if d == 1 and ys[lead + i] != 1]
        if any(d is None for d in xs):
            raise Unsupported(f"the shape of {x} is not known")
        if not axes:
            return grad
        summed = self.op("ReduceSum", grad, self.ints(axes), keepdims=1)
        return self.op("Reshape", summed, self.op("Shape", x))

    def like(self, grad: str, x: str) -> str:
        """``grad`` reshaped to ``x``'s shape (the same number of elements)."""
        return self.op("Reshape", grad, self.op("Shape", x))


def differentiate(model: Any, wrt: list[str], loss: str, shapes: dict[str, list[Dim]], types: dict[str, int],
                  values: dict[str, np.ndarray] | None = None) -> list[str]:  # fmt: skip
    """Add to ``model`` (in place) the nodes computing the gradient of the scalar ``loss`` with
    respect to each of ``wrt`` (graph inputs); the gradients' names, in ``wrt``'s order. ``shapes``
    and ``types``: every tensor's (a batch-dependent dim as a string); ``values``: the integer
    tensors whose value does not depend on the batch."""
    graph = model.graph
    reach = set(wrt)
    for node in graph.node:
        if node.op_type not in NOT_DIFFERENTIABLE and any(i in reach for i in node.input):
            reach.update(o for o in node.output if o)
    b = Builder(model, shapes, types, values or {})
    grads: dict[str, list[str]] = {loss: [b.const(1.0)]}
    for node in reversed(list(graph.node)):
        outs = [_summed(b, grads.pop(o, [])) for o in node.output]
        if all(g is None for g in outs) or not any(i in reach for i in node.input):
            continue
        fn = RULES.get(node.op_type)
        if fn is None:
            raise Unsupported(f"no gradient rule for {node.op_type} ({node.name})")
        for inp, g in zip(node.input, fn(b, node, outs), strict=False):
            if g is not None and inp in reach:
                if b.types.get(inp, TensorProto.FLOAT) not in FLOATS:
                    raise Unsupported(f"a gradient reaches {inp}, which is not float32")
                grads.setdefault(inp, []).append(g)
    names = []
    for w in wrt:
        g = _summed(b, grads.pop(w, []))
        if g is None:  # a tensor the loss does not depend on
            g = b.op(
                "ConstantOfShape",
                b.op("Shape", w),
                value=helper.make_tensor("", TensorProto.FLOAT, [1], [0.0]),
            )
        names.append(b.op("Identity", g))
    graph.node.extend(b.nodes)
    graph.initializer.extend(b.initializers)
    return names


def _summed(b: Builder, parts: list[str]) -> str | None:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else b.op("Sum", *parts)
