"""More gradient rules (:mod:`.onnx_grad`): the exponential-linear family, the trigonometric and
rounding functions, elementwise Max/Min, PRelu, the L2 and square-sum reductions (weight
normalisation), depth-to-space and its inverse, CumSum and Tile, each as PyTorch's autograd
defines it (``elu``'s at 0 is the exponential side's, ``max``'s tie is shared evenly)."""

from __future__ import annotations

from typing import Any

from tasks.prepare.runtimes.autograd.onnx_grad import Builder, Unsupported, attr, rule
from tasks.prepare.runtimes.autograd.onnx_grad_rules import reduced_axes

G = list[str | None]


@rule("Elu", "Selu", "Celu")
def _exponential_linear(b: Builder, node: Any, gy: G) -> G:
    """Above 0 the slope (``gamma`` for Selu, else 1); at or below 0 ``alpha e^(x/c)`` times it."""
    g, x, op = gy[0], node.input[0], node.op_type
    alpha = attr(node, "alpha", {"Elu": 1.0, "Selu": 1.67326319217681884765625, "Celu": 1.0}[op])
    gamma = attr(node, "gamma", 1.05070102214813232421875) if op == "Selu" else 1.0
    scale = 1.0 / alpha if op == "Celu" else 1.0
    below = b.op("Mul", b.op("Exp", b.op("Mul", x, b.const(scale))), b.const(gamma * alpha * scale))
    slope = b.op("Where", b.op("Greater", x, b.const(0.0)), b.const(gamma), below)
    return [b.op("Mul", g, slope)]


@rule("Softsign", "Atan", "Sin", "Cos", "Sign", "Floor", "Ceil", "Round")
def _more_unary(b: Builder, node: Any, gy: G) -> G:
    g, x, op = gy[0], node.input[0], node.op_type
    one = b.const(1.0)
    if op == "Softsign":
        d = b.op("Add", one, b.op("Abs", x))
        return [b.op("Div", g, b.op("Mul", d, d))]
    if op == "Atan":
        return [b.op("Div", g, b.op("Add", one, b.op("Mul", x, x)))]
    if op == "Sin":
        return [b.op("Mul", g, b.op("Cos", x))]
    if op == "Cos":
        return [b.op("Neg", b.op("Mul", g, b.op("Sin", x)))]
    return [b.op("Mul", g, b.const(0.0))]  # piecewise constant: 0 almost everywhere, as PyTorch's


@rule("Max", "Min")
def _elementwise_extreme(b: Builder, node: Any, gy: G) -> G:
    """Each input takes the gradient where it is the result, shared evenly among equal inputs."""
    y, g = node.output[0], gy[0]
    hits = [b.op("Cast", b.op("Equal", x, y), to=1) for x in node.input]
    count = hits[0]
    for hit in hits[1:]:
        count = b.op("Add", count, hit)
    share = b.op("Div", g, count)
    return [b.unbroadcast(b.op("Mul", share, hit), x, y) for x, hit in zip(node.input, hits, strict=True)]


@rule("PRelu")
def _prelu(b: Builder, node: Any, gy: G) -> G:
    (x, slope), y, g = node.input, node.output[0], gy[0]
    positive = b.op("Greater", x, b.const(0.0))
    gx = b.op("Mul", g, b.op("Where", positive, b.const(1.0), slope))
    gs = b.op("Where", positive, b.const(0.0), b.op("Mul", g, x))
    return [gx, b.unbroadcast(gs, slope, y)]


@rule("ReduceL2", "ReduceSumSquare")
def _reduce_square(b: Builder, node: Any, gy: G) -> G:
    """``sum(x^2)``'s is ``2 x g``; the norm's ``x g / norm`` (0 where the norm is 0, as PyTorch's)."""
    x, y, g = node.input[0], node.output[0], gy[0]
    rest = [None] * (len(node.input) - 1)
    axes = reduced_axes(b, node, x)
    if axes is None:
        raise Unsupported(f"{node.op_type} over no axis")
    if not attr(node, "keepdims", 1):
        g, y = b.op("Unsqueeze", g, b.ints(axes)), b.op("Unsqueeze", y, b.ints(axes))
    if node.op_type == "ReduceSumSquare":
        return [b.op("Mul", b.op("Mul", x, g), b.const(2.0)), *rest]
    zero = b.const(0.0)
    safe = b.op("Where", b.op("Equal", y, zero), b.const(1.0), y)
    ratio = b.op("Where", b.op("Equal", y, zero), zero, b.op("Div", g, safe))
    return [b.op("Mul", x, ratio), *rest]


@rule("DepthToSpace", "SpaceToDepth")
def _depth_space(b: Builder, node: Any, gy: G) -> G:
    """Each moves elements without changing them: the gradient moves back by the inverse (the
    inverse of DCR depth-to-space is space-to-depth; of CRD, a reshape and transpose)."""
    block, g, x = attr(node, "blocksize"), gy[0], node.input[0]
    if node.op_type == "SpaceToDepth":
        return [b.op("DepthToSpace", g, blocksize=block, mode="DCR")]
    if attr(node, "mode", b"DCR") in (b"DCR", "DCR"):
        return [b.op("SpaceToDepth", g, blocksize=block)]
    n, c, h, w = b.shape(x)
    if not all(isinstance(d, int) for d in (c, h, w)):
        raise Unsupported("a CRD DepthToSpace of unknown sizes")
    c_out = c // (block * block)
    split = b.op("Reshape", g, b.ints([-1, c_out, h, block, w, block]))
    moved = b.op("Transpose", split, perm=[0, 1, 3, 5, 2, 4])
    return [b.op("Reshape", moved, b.ints([-1, c, h, w]))]


@rule("CumSum")
def _cumsum(b: Builder, node: Any, gy: G) -> G:
    """The cumulative sum of the gradient in the other direction."""
    axis = node.input[1]
    exclusive, reverse = attr(node, "exclusive", 0), attr(node, "reverse", 0)
    return [b.op("CumSum", gy[0], axis, exclusive=exclusive, reverse=1 - reverse), None]


@rule("Tile")
def _tile(b: Builder, node: Any, gy: G) -> G:
    """Each copy's gradient summed back: the gradient as [r0, d0, r1, d1, ...] summed over the r's."""
    x, repeats = node.input
    reps = [int(r) for r in b.constant(repeats).tolist()]
    sizes = b.op("Shape", x)
    split = [part for i, r in enumerate(reps)
             for part in (b.ints([r]), b.op("Slice", sizes, b.ints([i]), b.ints([i + 1])))]  # fmt: skip
    g = b.op("Reshape", gy[0], b.op("Concat", *split, axis=0))
    return [b.op("ReduceSum", g, b.ints(list(range(0, 2 * len(reps), 2))), keepdims=0), None]
