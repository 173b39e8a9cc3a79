"""Gradient rules of ONNX's network operators (:mod:`.onnx_grad`): convolutions, pooling, softmax,
the cross-entropy loss and the normalisations, each in operators a board's inference build runs.

A convolution's input gradient is the transposed convolution of the output gradient; its weight
gradient is :mod:`.onnx_grad_conv`'s. A max pool that does not tile its input returns the flat
index of each maximum (its second output), and its gradient scatters there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tasks.prepare.runtimes.autograd.onnx_grad import Builder, Unsupported, attr, rule
from tasks.prepare.runtimes.autograd.onnx_grad_conv import weight_grad

G = list[str | None]
REDUCTIONS = ("mean", "sum", "none")  # of SoftmaxCrossEntropyLoss


def _spatial(
    b: Builder, node: Any, x: str
) -> tuple[int, list[int], list[int], list[int], list[int], list[int]]:
    """(spatial rank, kernel, strides, dilations, pads, the input's spatial sizes) of a conv or pool."""
    shape = b.shape(x)
    n = len(shape) - 2
    if attr(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise Unsupported(f"{node.op_type} with auto_pad")
    kernel = list(attr(node, "kernel_shape") or b.static(node.input[1])[2:])
    strides = list(attr(node, "strides") or [1] * n)
    dilations = list(attr(node, "dilations") or [1] * n)
    pads = list(attr(node, "pads") or [0] * (2 * n))
    return n, kernel, strides, dilations, pads, b.static(x, range(2, n + 2))


@rule("Conv")
def _conv(b: Builder, node: Any, gy: G) -> G:
    x, w, g, y = node.input[0], node.input[1], gy[0], node.output[0]
    n, kernel, strides, dilations, pads, sizes = _spatial(b, node, x)
    groups = attr(node, "group", 1)
    out_sizes = b.static(y, range(2, n + 2))
    # the input gradient: a transposed convolution, padded at the end to the input's exact size
    extra = [s - ((o - 1) * st - p0 - p1 + d * (k - 1) + 1)
             for s, o, st, p0, p1, d, k in zip(sizes, out_sizes, strides, pads[:n], pads[n:], dilations, kernel, strict=True)]  # fmt: skip
    if any(e < 0 or e >= max(st, d) for e, st, d in zip(extra, strides, dilations, strict=True)):
        raise Unsupported("a Conv whose input gradient's size the transposed convolution cannot give")
    gx = b.op("ConvTranspose", g, w, group=groups, strides=strides, dilations=dilations, pads=pads,
              output_padding=extra, kernel_shape=kernel)  # fmt: skip
    grads: G = [
        gx,
        weight_grad(b, x, g, (sizes, out_sizes), groups, kernel, strides, dilations, pads, b.static(w)),
    ]
    if len(node.input) > 2 and node.input[2]:
        grads.append(b.op("ReduceSum", g, b.ints([0, *range(2, n + 2)]), keepdims=0))
    return grads


@rule("ConvTranspose")
def _conv_transpose(b: Builder, node: Any, gy: G) -> G:
    """The adjoint of a convolution: its input gradient is the convolution of the output gradient
    (its output padding cut off where the padding does not cover it), its weight gradient the
    convolution's weight gradient with input and output exchanged."""
    x, w, g = node.input[0], node.input[1], gy[0]
    n, kernel, strides, dilations, pads, in_sizes = _spatial(b, node, x)
    if attr(node, "output_shape") is not None:
        raise Unsupported("a ConvTranspose with output_shape")
    groups, extra = attr(node, "group", 1), list(attr(node, "output_padding") or [0] * n)
    cut = [max(e - p, 0) for e, p in zip(extra, pads[n:], strict=True)]
    sizes = b.static(node.output[0], range(2, n + 2))
    if any(cut):
        sizes = [s - c for s, c in zip(sizes, cut, strict=True)]
        g = b.op("Slice", g, b.ints([0] * n), b.ints(sizes), b.ints(list(range(2, n + 2))))
    conv_pads = [*pads[:n], *(max(p - e, 0) for p, e in zip(pads[n:], extra, strict=True))]
    gx = b.op(
        "Conv", g, w, group=groups, strides=strides, dilations=dilations, pads=conv_pads, kernel_shape=kernel
    )
    grads: G = [
        gx,
        weight_grad(b, g, x, (sizes, in_sizes), groups, kernel, strides, dilations, conv_pads, b.static(w)),
    ]
    if len(node.input) > 2 and node.input[2]:
        grads.append(b.op("ReduceSum", gy[0], b.ints([0, *range(2, n + 2)]), keepdims=0))
    return grads


def tiling(node: Any) -> bool:
    """Whether a MaxPool's windows tile its input (kernel = stride, no padding or dilation): its
    gradient then needs no indices (:func:`_maxpool`)."""
    kernel = list(attr(node, "kernel_shape"))
    return (list(attr(node, "strides") or [1] * len(kernel)) == kernel and not any(attr(node, "pads") or [0])
            and all(d == 1 for d in attr(node, "dilations") or [1]) and not attr(node, "ceil_mode", 0)
            and attr(node, "auto_pad", "NOTSET") in ("NOTSET", "VALID") and len(kernel) <= 2)  # fmt: skip


# a tiling pool's windows up to this many positions are taken one position at a time (~7 small
# nodes each: the digits step's 2x2 pool, 0.1-0.3 ms faster than the windows' layout); larger
# ones (a global pool over 16x16 made 2 249 nodes) are laid out a window a row
TAPS = 9


@rule("MaxPool")
def _maxpool(b: Builder, node: Any, gy: G) -> G:
    """A tiling pool's gradient goes to each window's first maximum (PyTorch's choice among ties),
    with no indices and no scatter (:func:`_by_taps`, :func:`_by_windows`); any other pool's is
    scattered to the flat indices its forward gave."""
    x, y, g = node.input[0], node.output[0], gy[0]
    if tiling(node):
        kernel = list(attr(node, "kernel_shape"))
        n = len(kernel)
        out, sizes = b.static(y, range(2, n + 2)), b.static(x, range(2, n + 2))
        grad = (_by_taps if math.prod(kernel) <= TAPS else _by_windows)(b, x, y, g, kernel, out, sizes)
        rest = [s - o * k for s, o, k in zip(sizes, out, kernel, strict=True)]
        if any(rest):  # the rows and columns past the last whole window get no gradient
            grad = b.op("Pad", grad, b.ints([0] * (n + 2) + [0, 0, *rest]))
        return [grad]
    if len(node.output) < 2 or attr(node, "storage_order", 0):
        raise Unsupported("a MaxPool without its indices")
    zeros = b.op("Mul", b.op("Reshape", x, b.ints([-1])), b.const(0.0))
    idx = b.op("Reshape", node.output[1], b.ints([-1]))
    flat = b.op("ScatterElements", zeros, idx, b.op("Reshape", g, b.ints([-1])), reduction="add")
    return [b.like(flat, x)]


def _by_taps(b: Builder, x: str, y: str, g: str, kernel: list[int], out: list[int], sizes: list[int]) -> str:
    """Each window position's values (a strided slice) compared with the pooled ones, the first hit
    kept, the gradient put there and the positions interleaved back: [N, C, o1 * k1, (o2 * k2)]."""
    n = len(kernel)
    axes, steps = b.ints(list(range(2, n + 2))), b.ints(kernel)
    parts, seen = [], None
    for offset in np.ndindex(*kernel):
        ends = [o + k * (s - 1) + 1 for o, k, s in zip(offset, kernel, out, strict=True)]
        tap = b.op("Slice", x, b.ints(list(offset)), b.ints(ends), axes, steps)
        hit = b.op("Equal", tap, y)
        first = hit if seen is None else b.op("And", hit, b.op("Not", seen))
        seen = hit if seen is None else b.op("Or", seen, hit)
        parts.append(b.op("Mul", g, b.op("Cast", first, to=1)))
    # [N, C, o1, (o2)] per offset -> [N, C, o1, k1, (o2, k2)] -> [N, C, o1 * k1, (o2 * k2)]
    spread = b.ints(list(range(3, 2 * n + 2, 2)))
    full = b.op("Concat", *(b.op("Unsqueeze", p, spread) for p in parts), axis=2 * n + 1)
    if n == 2:
        rows = [b.op("Slice", full, b.ints([i * kernel[1]]), b.ints([(i + 1) * kernel[1]]), b.ints([5]))
                for i in range(kernel[0])]  # fmt: skip
        full = b.op("Concat", *rows, axis=3)
    return b.op("Reshape", full, b.ints([0, 0, *(o * k for o, k in zip(out, kernel, strict=True))]))


def _by_windows(
    b: Builder, x: str, y: str, g: str, kernel: list[int], out: list[int], sizes: list[int]
) -> str:
    """The input laid out a window a row, compared with the pooled values, the first hit kept (a
    running count of hits equal to one), the gradient put there and laid out back: a fixed number
    of nodes whatever the window's size."""
    n = len(kernel)
    used = [o * k for o, k in zip(out, kernel, strict=True)]
    if used != sizes:
        x = b.op("Slice", x, b.ints([0] * n), b.ints(used), b.ints(list(range(2, n + 2))))
    # [N, C, o1, k1, (o2, k2)] -> [N, C, o1, (o2), k1 * (k2)]: each window's values on one axis
    split = [v for o, k in zip(out, kernel, strict=True) for v in (o, k)]
    order = [0, 1, *range(2, 2 * n + 2, 2), *range(3, 2 * n + 2, 2)]
    windows = b.op("Transpose", b.op("Reshape", x, b.ints([0, 0, *split])), perm=order)
    windows = b.op("Reshape", windows, b.ints([0, 0, *out, math.prod(kernel)]))
    last = b.ints([-1])
    hit = b.op("Cast", b.op("Equal", windows, b.op("Unsqueeze", y, last)), to=1)
    first = b.op("Mul", hit, b.op("Cast", b.op("Equal", b.op("CumSum", hit, last), b.const(1.0)), to=1))
    spread = b.op("Mul", first, b.op("Unsqueeze", g, last))
    back = [0, 1, *(v for i in range(n) for v in (2 + i, 2 + n + i))]
    spread = b.op("Transpose", b.op("Reshape", spread, b.ints([0, 0, *out, *kernel])), perm=back)
    return b.op("Reshape", spread, b.ints([0, 0, *used]))


@rule("AveragePool")
def _avgpool(b: Builder, node: Any, gy: G) -> G:
    x, y, g = node.input[0], node.output[0], gy[0]
    n, kernel, strides, _, pads, sizes = _spatial(b, node, x)
    if attr(node, "ceil_mode", 0) or (any(pads) and not attr(node, "count_include_pad", 0)):
        raise Unsupported("an AveragePool with ceil_mode or padding left out of its count")
    channels = b.static(x, [1])[0]
    out_sizes = b.static(y, range(2, n + 2))
    extra = [s + p0 + p1 - ((o - 1) * st + k) for s, o, st, p0, p1, k in zip(sizes, out_sizes, strides, pads[:n], pads[n:], kernel, strict=True)]  # fmt: skip
    if any(e < 0 or e >= st for e, st in zip(extra, strides, strict=True)):
        raise Unsupported("an AveragePool whose gradient's size a transposed convolution cannot give")
    size = 1
    for k in kernel:
        size *= k
    weight = b.const(np.full([channels, 1, *kernel], 1.0 / size))
    return [b.op("ConvTranspose", g, weight, group=channels, strides=strides, pads=pads, output_padding=extra,
                 kernel_shape=kernel)]  # fmt: skip


@rule("Softmax", "LogSoftmax")
def _softmax(b: Builder, node: Any, gy: G) -> G:
    y, g, axis = node.output[0], gy[0], attr(node, "axis", -1)
    if node.op_type == "Softmax":
        dot = b.op("ReduceSum", b.op("Mul", g, y), b.ints([axis]), keepdims=1)
        return [b.op("Mul", y, b.op("Sub", g, dot))]
    total = b.op("ReduceSum", g, b.ints([axis]), keepdims=1)
    return [b.op("Sub", g, b.op("Mul", b.op("Exp", y), total))]


@rule("SoftmaxCrossEntropyLoss")
def _cross_entropy(b: Builder, node: Any, gy: G) -> G:
    """Reduced by ``mean`` (over the labels not ignored), ``sum`` or ``none`` (one loss a label)."""
    scores, labels = node.input[:2]
    reduction = attr(node, "reduction", "mean")
    if len(node.input) > 2 and node.input[2] or reduction not in REDUCTIONS or any(gy[1:]):
        raise Unsupported(
            "a SoftmaxCrossEntropyLoss with weights, its log-probabilities used or another reduction"
        )
    classes = b.static(scores, [1])[0]
    ignore = attr(node, "ignore_index")
    keep = None
    if ignore is not None:
        keep = b.op("Not", b.op("Equal", labels, b.const(ignore, "int64")))
        labels = b.op("Where", keep, labels, b.const(0, "int64"))
    onehot = b.op("OneHot", labels, b.const(classes, "int64"), b.const([0.0, 1.0]), axis=1)
    diff = b.op("Sub", b.op("Softmax", scores, axis=1), onehot)
    if keep is not None:
        mask = b.op("Cast", keep, to=1)
        diff = b.op("Mul", diff, b.op("Unsqueeze", mask, b.ints([1])))
    if reduction == "none":  # one gradient a label: along the classes' axis
        return [b.op("Mul", diff, b.op("Unsqueeze", gy[0], b.ints([1]))), None]
    if reduction == "sum":
        return [b.op("Mul", diff, gy[0]), None]
    count = b.op("Cast", b.op("Size", labels), to=1) if keep is None else b.op("ReduceSum", mask, keepdims=0)
    return [b.op("Mul", diff, b.op("Div", gy[0], count)), None]


def _per_channel(b: Builder, v: str, rank: int) -> str:
    return b.op("Unsqueeze", v, b.ints(list(range(1, rank - 1))))


@rule("BatchNormalization")
def _batchnorm(b: Builder, node: Any, gy: G) -> G:
    if attr(node, "training_mode", 0):
        raise Unsupported("a BatchNormalization in training mode left unlowered")
    x, scale, bias, mean, var = node.input
    g, rank = gy[0], len(b.shape(x))
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", var, b.const(attr(node, "epsilon", 1e-5)))))
    gx = b.op("Mul", g, _per_channel(b, b.op("Mul", scale, inv), rank))
    xhat = b.op("Mul", b.op("Sub", x, _per_channel(b, mean, rank)), _per_channel(b, inv, rank))
    axes = b.ints([0, *range(2, rank)])
    return [gx, b.op("ReduceSum", b.op("Mul", g, xhat), axes, keepdims=0), b.op("ReduceSum", g, axes, keepdims=0),
            None, None]  # fmt: skip


@rule("LayerNormalization")
def _layernorm(b: Builder, node: Any, gy: G) -> G:
    if any(gy[1:]):
        raise Unsupported("a LayerNormalization whose statistics are used")
    x, scale = node.input[:2]
    rank = len(b.shape(x))
    axis = attr(node, "axis", -1) % rank
    outer = b.ints(list(range(axis)))
    mean = b.op("ReduceMean", x, axes=list(range(axis, rank)), keepdims=1)
    d = b.op("Sub", x, mean)
    var = b.op("ReduceMean", b.op("Mul", d, d), axes=list(range(axis, rank)), keepdims=1)
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", var, b.const(attr(node, "epsilon", 1e-5)))))
    xhat = b.op("Mul", d, inv)
    gs = b.op("Mul", gy[0], scale)
    m1 = b.op("ReduceMean", gs, axes=list(range(axis, rank)), keepdims=1)
    m2 = b.op("ReduceMean", b.op("Mul", gs, xhat), axes=list(range(axis, rank)), keepdims=1)
    gx = b.op("Mul", inv, b.op("Sub", b.op("Sub", gs, m1), b.op("Mul", xhat, m2)))
    grads: G = [
        gx,
        b.op("ReduceSum", b.op("Mul", gy[0], xhat), outer, keepdims=0) if axis else b.op("Mul", gy[0], xhat),
    ]
    if len(node.input) > 2 and node.input[2]:
        grads.append(b.op("ReduceSum", gy[0], outer, keepdims=0) if axis else gy[0])
    return grads


@rule("InstanceNormalization")
def _instancenorm(b: Builder, node: Any, gy: G) -> G:
    """Each sample's channel normalised over its other axes (GroupNorm exports as this), then
    scaled and shifted per channel."""
    x, scale = node.input[:2]
    rank = len(b.shape(x))
    inner = list(range(2, rank))
    mean = b.op("ReduceMean", x, axes=inner, keepdims=1)
    d = b.op("Sub", x, mean)
    var = b.op("ReduceMean", b.op("Mul", d, d), axes=inner, keepdims=1)
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", var, b.const(attr(node, "epsilon", 1e-5)))))
    xhat = b.op("Mul", d, inv)
    gs = b.op("Mul", gy[0], _per_channel(b, scale, rank))
    m1 = b.op("ReduceMean", gs, axes=inner, keepdims=1)
    m2 = b.op("ReduceMean", b.op("Mul", gs, xhat), axes=inner, keepdims=1)
    gx = b.op("Mul", inv, b.op("Sub", b.op("Sub", gs, m1), b.op("Mul", xhat, m2)))
    axes = b.ints([0, *inner])
    return [
        gx,
        b.op("ReduceSum", b.op("Mul", gy[0], xhat), axes, keepdims=0),
        b.op("ReduceSum", gy[0], axes, keepdims=0),
    ]
