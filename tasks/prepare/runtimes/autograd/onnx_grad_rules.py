"""Gradient rules of ONNX's elementwise, shape, reduction and matrix operators (:mod:`.onnx_grad`).

Each rule takes the builder, the forward node and its outputs' gradients, and returns its inputs'
gradients (None where an input takes none), as PyTorch's autograd defines them: ``relu``'s at 0 is
0, ``hardtanh``'s (a ``Clip``) is 0 at both bounds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tasks.prepare.runtimes.autograd.onnx_grad import Builder, Unsupported, attr, rule

INT_MAX = np.iinfo(np.int64).max
G = list[str | None]


def _mask(b: Builder, cond: str, g: str) -> str:
    return b.op("Mul", g, b.op("Cast", cond, to=1))


@rule("Add", "Sub", "Mul", "Div")
def _arith(b: Builder, node: Any, gy: G) -> G:
    (g,), (x, w), y = gy, node.input, node.output[0]
    if node.op_type == "Add":
        return [b.unbroadcast(g, x, y), b.unbroadcast(g, w, y)]
    if node.op_type == "Sub":
        return [b.unbroadcast(g, x, y), b.unbroadcast(b.op("Neg", g), w, y)]
    if node.op_type == "Mul":
        return [b.unbroadcast(b.op("Mul", g, w), x, y), b.unbroadcast(b.op("Mul", g, x), w, y)]
    gx = b.op("Div", g, w)
    return [b.unbroadcast(gx, x, y), b.unbroadcast(b.op("Neg", b.op("Mul", gx, y)), w, y)]


@rule("Pow")
def _pow(b: Builder, node: Any, gy: G) -> G:
    x, e = node.input
    b.constant(e)  # a computed exponent takes a gradient too: not here
    factor = b.op("Mul", e, b.op("Pow", x, b.op("Sub", e, b.const(1.0))))
    return [b.unbroadcast(b.op("Mul", gy[0], factor), x, node.output[0]), None]


@rule("Neg", "Identity", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Abs", "Erf",
      "LeakyRelu", "HardSigmoid", "HardSwish", "Softplus")  # fmt: skip
def _unary(b: Builder, node: Any, gy: G) -> G:
    g, x, y, op = gy[0], node.input[0], node.output[0], node.op_type
    zero, one = b.const(0.0), b.const(1.0)
    if op == "Identity":
        return [g]
    if op == "Neg":
        return [b.op("Neg", g)]
    if op == "Relu":
        return [_mask(b, b.op("Greater", y, zero), g)]
    if op == "Sigmoid":
        return [b.op("Mul", g, b.op("Mul", y, b.op("Sub", one, y)))]
    if op == "Tanh":
        return [b.op("Mul", g, b.op("Sub", one, b.op("Mul", y, y)))]
    if op == "Exp":
        return [b.op("Mul", g, y)]
    if op == "Log":
        return [b.op("Div", g, x)]
    if op == "Sqrt":
        return [b.op("Div", g, b.op("Mul", b.const(2.0), y))]
    if op == "Reciprocal":
        return [b.op("Neg", b.op("Mul", g, b.op("Mul", y, y)))]
    if op == "Abs":
        return [b.op("Mul", g, b.op("Sign", x))]
    if op == "Erf":
        bell = b.op("Exp", b.op("Neg", b.op("Mul", x, x)))
        return [b.op("Mul", g, b.op("Mul", bell, b.const(2.0 / math.sqrt(math.pi))))]
    if op == "Softplus":
        return [b.op("Mul", g, b.op("Sigmoid", x))]
    if op == "LeakyRelu":
        slope = b.op("Where", b.op("Greater", x, zero), one, b.const(attr(node, "alpha", 0.01)))
        return [b.op("Mul", g, slope)]
    if op == "HardSigmoid":
        alpha, beta = attr(node, "alpha", 0.2), attr(node, "beta", 0.5)
        z = b.op("Add", b.op("Mul", x, b.const(alpha)), b.const(beta))
        inside = b.op("And", b.op("Greater", z, zero), b.op("Less", z, one))
        return [_mask(b, inside, b.op("Mul", g, b.const(alpha)))]
    # HardSwish, as PyTorch: 0 below -3, x / 3 + 1/2 up to 3 (included), 1 above
    slope = b.op("Add", b.op("Div", x, b.const(3.0)), b.const(0.5))
    slope = b.op("Where", b.op("Less", x, b.const(-3.0)), zero, slope)
    slope = b.op("Where", b.op("Greater", x, b.const(3.0)), one, slope)
    return [b.op("Mul", g, slope)]


@rule("Clip")
def _clip(b: Builder, node: Any, gy: G) -> G:
    x, bounds = node.input[0], list(node.input[1:])
    inside = None
    for name, op in zip(bounds, ("Greater", "Less"), strict=False):
        if name:
            cond = b.op(op, x, name)
            inside = cond if inside is None else b.op("And", inside, cond)
    return [gy[0] if inside is None else _mask(b, inside, gy[0]), None, None]


@rule("Where")
def _where(b: Builder, node: Any, gy: G) -> G:
    c, x, w = node.input
    zero = b.const(0.0)
    return [None, b.unbroadcast(b.op("Where", c, gy[0], zero), x, node.output[0]),
            b.unbroadcast(b.op("Where", c, zero, gy[0]), w, node.output[0])]  # fmt: skip


@rule("Cast")
def _cast(b: Builder, node: Any, gy: G) -> G:
    if attr(node, "to") != 1 or b.types.get(node.input[0]) != 1:
        return [None]
    return [gy[0]]


@rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(b: Builder, node: Any, gy: G) -> G:
    return [b.like(gy[0], node.input[0]), *([None] * (len(node.input) - 1))]


@rule("Transpose")
def _transpose(b: Builder, node: Any, gy: G) -> G:
    perm = attr(node, "perm") or list(reversed(range(len(b.shape(node.input[0])))))
    return [b.op("Transpose", gy[0], perm=[int(i) for i in np.argsort(perm)])]


@rule("Expand")
def _expand(b: Builder, node: Any, gy: G) -> G:
    return [b.unbroadcast(gy[0], node.input[0], node.output[0]), None]


@rule("Concat")
def _concat(b: Builder, node: Any, gy: G) -> G:
    axis = attr(node, "axis")
    start, axes, grads = b.ints([0]), b.ints([axis]), []
    for x in node.input:
        size = b.op(
            "Slice", b.op("Shape", x), b.ints([axis % len(b.shape(x))]), b.ints([axis % len(b.shape(x)) + 1])
        )
        end = b.op("Add", start, size)
        grads.append(b.op("Slice", gy[0], start, end, axes))
        start = end
    return grads


@rule("Split")
def _split(b: Builder, node: Any, gy: G) -> G:
    axis = attr(node, "axis", 0)
    zero = b.const(0.0)
    parts = [
        g if g is not None else b.op("Mul", b.op("Identity", y), zero)
        for g, y in zip(gy, node.output, strict=True)
    ]
    return [b.op("Concat", *parts, axis=axis), None]


def reduced_axes(b: Builder, node: Any, x: str) -> list[int] | None:
    rank = len(b.shape(x))
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = b.constant(node.input[1]).tolist()
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted(int(a) % rank for a in axes)


@rule("ReduceSum", "ReduceMean", "GlobalAveragePool")
def _reduce(b: Builder, node: Any, gy: G) -> G:
    x, y, g = node.input[0], node.output[0], gy[0]
    rest = [None] * (len(node.input) - 1)
    if node.op_type == "GlobalAveragePool":
        axes: list[int] | None = list(range(2, len(b.shape(x))))
        keep = 1
    else:
        axes, keep = reduced_axes(b, node, x), attr(node, "keepdims", 1)
    if axes is None:
        return [g, *rest]
    if not keep:
        g = b.op("Unsqueeze", g, b.ints(axes))
    g = b.op("Expand", g, b.op("Shape", x))
    if node.op_type != "ReduceSum":
        count = b.op("Div", b.op("Cast", b.op("Size", x), to=1), b.op("Cast", b.op("Size", y), to=1))
        g = b.op("Div", g, count)
    return [g, *rest]


@rule("ReduceMax", "ReduceMin")
def _reduce_extreme(b: Builder, node: Any, gy: G) -> G:
    """Shared evenly among the elements equal to the extreme (PyTorch's ``amax``; after a ReLU the
    ties are zeros, whose gradient the ReLU stops anyway)."""
    x, y, g = node.input[0], node.output[0], gy[0]
    axes = reduced_axes(b, node, x)
    rest = [None] * (len(node.input) - 1)
    if axes is None:
        return [g, *rest]
    if not attr(node, "keepdims", 1):
        g, y = b.op("Unsqueeze", g, b.ints(axes)), b.op("Unsqueeze", y, b.ints(axes))
    hit = b.op("Cast", b.op("Equal", x, y), to=1)
    count = b.op("ReduceSum", hit, b.ints(axes), keepdims=1)
    return [b.op("Mul", hit, b.op("Div", g, count)), *rest]


def _swap_last(b: Builder, x: str) -> str:
    rank = len(b.shape(x))
    if rank < 2:
        raise Unsupported("a MatMul of a vector")
    return b.op("Transpose", x, perm=[*range(rank - 2), rank - 1, rank - 2])


@rule("MatMul")
def _matmul(b: Builder, node: Any, gy: G) -> G:
    (x, w), y, g = node.input, node.output[0], gy[0]
    gx = b.unbroadcast(b.op("MatMul", g, _swap_last(b, w)), x, y) if len(b.shape(x)) >= 2 else None
    gw = b.unbroadcast(b.op("MatMul", _swap_last(b, x), g), w, y)
    if gx is None:
        raise Unsupported("a MatMul of a vector")
    return [gx, gw]


@rule("Gemm")
def _gemm(b: Builder, node: Any, gy: G) -> G:
    a, w = node.input[:2]
    alpha, beta = attr(node, "alpha", 1.0), attr(node, "beta", 1.0)
    ta, tb, g = attr(node, "transA", 0), attr(node, "transB", 0), gy[0]
    if ta:
        ga = b.op("Gemm", w, g, alpha=alpha, transA=tb, transB=1)
    else:
        ga = b.op("Gemm", g, w, alpha=alpha, transB=0 if tb else 1)
    if tb:
        gw = b.op("Gemm", g, a, alpha=alpha, transA=1, transB=ta)
    else:
        gw = b.op("Gemm", a, g, alpha=alpha, transA=0 if ta else 1)
    out: G = [ga, gw]
    if len(node.input) > 2 and node.input[2]:
        gc = b.op("Mul", g, b.const(beta)) if beta != 1.0 else g
        out.append(b.unbroadcast(gc, node.input[2], node.output[0]))
    return out
