"""Gradient rules of the slices, gathers and scatters (:mod:`.onnx_grad`): what indexing, padding,
boolean masks, sorting and ``gather``/``scatter`` export as.

``x[a:b:k]`` exports as a ``Slice`` (its gradient padded back, or scattered back per axis with a
step; a Slice whose bounds the graph computes padded by computed amounts) and ``F.pad`` as a
``Pad`` (its gradient sliced back); ``x[idx]`` and an embedding as a ``Gather``.
``x[mask, :]`` exports as ``NonZero`` (no gradient) and a ``GatherND`` of its positions;
``x[mask] = y`` as a ``ScatterND``; ``torch.gather`` and ``scatter`` as ``GatherElements`` and
``ScatterElements``; ``sort`` and ``topk`` as ``TopK``. A gather's gradient is added back at the
positions it read (repeated ones summed); a scatter's input keeps the gradient of the positions it
did not overwrite and its updates take those of the positions they were written to. Every add is a
ScatterElements, which ONNX Runtime adds serially (its ScatterND add loses updates of one index on
two threads: :mod:`.onnx_passes`). As PyTorch's ``index_put``, which of two updates written to one
position wins is left to the runtime.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.prepare.runtimes.autograd.onnx_grad import Builder, Unsupported, attr, rule

INT_MAX = np.iinfo(np.int64).max
G = list[str | None]


def _zeros(b: Builder, x: str) -> str:
    """Zeros shaped as ``x`` (not ``x * 0``, which is NaN where ``x`` is infinite)."""
    return b.op("ConstantOfShape", b.op("Shape", x))


def _wrapped(b: Builder, index: str, size: str) -> str:
    """``index`` with each negative one counted from the end of an axis of ``size`` elements."""
    return b.op("Where", b.op("Less", index, b.ints(0)), b.op("Add", index, size), index)


def _flat_rows(b: Builder, node: Any) -> tuple[str, str]:
    """A GatherND's index tuples as flat positions over the data's first ``k`` axes (``k`` the
    tuples' length), ``[M]``; the product of the data's other sizes, ``[1]``."""
    data, indices = node.input[:2]
    if attr(node, "batch_dims", 0):
        raise Unsupported(f"a {node.op_type} with batch_dims")
    rank, (k,) = len(b.shape(data)), b.static(indices, [-1])
    sizes = b.op("Shape", data)
    flat = None
    for j in range(k):
        size = b.op("Slice", sizes, b.ints([j]), b.ints([j + 1]))
        index = _wrapped(b, b.op("Gather", indices, b.ints(j), axis=-1), size)
        flat = index if flat is None else b.op("Add", b.op("Mul", flat, size), index)
    rest = b.op("Slice", sizes, b.ints([k]), b.ints([rank])) if k < rank else b.ints([1])
    return b.op("Reshape", flat, b.ints([-1])), b.op("ReduceProd", rest, keepdims=1)


def _added_at_rows(b: Builder, node: Any, g: str) -> str:
    """``g`` (one row per index tuple of a GatherND) added into zeros shaped as the data at the
    positions the tuples name."""
    data = node.input[0]
    flat, width = _flat_rows(b, node)
    rows = b.op("Reshape", g, b.op("Concat", b.ints([-1]), width, axis=0))
    table = b.op("Reshape", _zeros(b, data), b.op("Concat", b.ints([-1]), width, axis=0))
    at = b.op("Expand", b.op("Unsqueeze", flat, b.ints([1])), b.op("Shape", rows))
    return b.like(b.op("ScatterElements", table, at, rows, axis=0, reduction="add"), data)


@rule("GatherND")
def _gather_nd(b: Builder, node: Any, gy: G) -> G:
    return [_added_at_rows(b, node, gy[0]), None]


@rule("ScatterND")
def _scatter_nd(b: Builder, node: Any, gy: G) -> G:
    """``reduction`` none: the data's gradient with zeros where the updates were written; add: all
    of it. The updates' gradient is the output gradient at their positions either way."""
    g, indices = gy[0], node.input[1]
    reduction = attr(node, "reduction", "none")
    if reduction not in ("none", "add"):
        raise Unsupported(f"a ScatterND with reduction {reduction}")
    updates = b.op("GatherND", g, indices)
    if reduction == "add":
        return [g, None, updates]
    return [b.op("ScatterND", g, indices, _zeros(b, node.input[2])), None, updates]


def _element_indices(b: Builder, node: Any) -> tuple[str, int]:
    """A GatherElements or ScatterElements' indices with negative ones wrapped; its axis."""
    data, indices = node.input[:2]
    axis = attr(node, "axis", 0) % len(b.shape(data))
    return _wrapped(b, indices, b.op("Shape", data, start=axis, end=axis + 1)), axis


@rule("GatherElements")
def _gather_elements(b: Builder, node: Any, gy: G) -> G:
    index, axis = _element_indices(b, node)
    return [b.op("ScatterElements", _zeros(b, node.input[0]), index, gy[0], axis=axis, reduction="add"), None]


@rule("ScatterElements")
def _scatter_elements(b: Builder, node: Any, gy: G) -> G:
    """As ScatterND's, along one axis."""
    g = gy[0]
    reduction = attr(node, "reduction", "none")
    if reduction not in ("none", "add"):
        raise Unsupported(f"a ScatterElements with reduction {reduction}")
    index, axis = _element_indices(b, node)
    updates = b.op("GatherElements", g, index, axis=axis)
    if reduction == "add":
        return [g, None, updates]
    return [b.op("ScatterElements", g, index, _zeros(b, node.input[2]), axis=axis), None, updates]


@rule("TopK")
def _top_k(b: Builder, node: Any, gy: G) -> G:
    """The values' gradient added back where each value was taken (the indices take none)."""
    x = node.input[0]
    if gy[0] is None:
        return [None, None]
    axis = attr(node, "axis", -1) % len(b.shape(x))
    return [b.op("ScatterElements", _zeros(b, x), node.output[1], gy[0], axis=axis, reduction="add"), None]


@rule("Slice")
def _slice(b: Builder, node: Any, gy: G) -> G:
    x = node.input[0]
    rank = len(b.shape(x))
    if node.input[1] not in b.constants or node.input[2] not in b.constants:
        return [_computed_slice(b, node, gy[0], rank), None, None, None, None]
    starts, ends = b.constant(node.input[1]), b.constant(node.input[2])
    axes = b.constant(node.input[3]) if len(node.input) > 3 and node.input[3] else np.arange(len(starts))
    steps = b.constant(node.input[4]) if len(node.input) > 4 and node.input[4] else np.ones(len(starts))
    axes = [int(a) % rank for a in axes]
    dims = b.static(x, axes)
    if np.any(steps != 1):  # each sliced axis scattered back to its positions (Python's slice is ONNX's)
        g = gy[0]
        for a, s, e, k, d in zip(axes, starts, ends, steps, dims, strict=True):
            hit = np.asarray(range(d)[slice(int(s), int(e), int(k))], dtype=np.int64)
            shape = b.op("Shape", g)
            size = b.op("Concat", b.op("Slice", shape, b.ints([0]), b.ints([a])), b.ints([d]),
                        b.op("Slice", shape, b.ints([a + 1]), b.ints([rank])), axis=0)  # fmt: skip
            index = b.op("Expand", b.ints(hit.reshape([-1 if i == a else 1 for i in range(rank)])), shape)
            g = b.op("ScatterElements", b.op("ConstantOfShape", size), index, g, axis=a)
        return [g, None, None, None, None]
    pads = [0] * (2 * rank)
    for a, s, e, d in zip(axes, starts, ends, dims, strict=True):
        s, e = (int(v) + d if v < 0 else min(int(v), d) for v in (s, e))
        pads[a], pads[rank + a] = max(s, 0), d - max(e, max(s, 0))
    return [b.op("Pad", gy[0], b.ints(pads)), None, None, None, None]


def _computed_slice(b: Builder, node: Any, g: str, rank: int) -> str:
    """The gradient of a Slice whose starts or ends the graph computes (the rows a mask selected, as
    ``x[mask] = y`` writes its updates), every step 1: the gradient padded by the sizes ONNX Runtime
    cuts, each bound counted from the end when negative and clamped into the axis."""
    if len(node.input) > 4 and node.input[4] and np.any(b.constant(node.input[4]) != 1):
        raise Unsupported("a Slice of computed bounds with steps")
    if len(node.input) > 3 and node.input[3]:
        axes = [int(a) % rank for a in b.constant(node.input[3])]
    else:
        axes = list(range(b.static(node.input[1])[0]))
    zero, shape = b.ints([0]), b.op("Shape", node.input[0])
    sizes = b.op("Gather", shape, b.ints(axes))

    def bound(name: str, low: str) -> str:
        at = b.op("Cast", name, to=7)  # int64, as the sizes (a Slice's bounds may be int32)
        wrapped = b.op("Where", b.op("Less", at, b.ints(0)), b.op("Add", at, sizes), at)
        return b.op("Max", b.op("Min", wrapped, sizes), low)

    start = bound(node.input[1], b.ints(0))
    end = bound(node.input[2], start)
    cut = {a: (b.op("Slice", start, b.ints([j]), b.ints([j + 1])),
               b.op("Slice", b.op("Sub", sizes, end), b.ints([j]), b.ints([j + 1]))) for j, a in enumerate(axes)}  # fmt: skip
    begins = [cut[a][0] if a in cut else zero for a in range(rank)]
    ends = [cut[a][1] if a in cut else zero for a in range(rank)]
    return b.op("Pad", g, b.op("Concat", *begins, *ends, axis=0))


@rule("Pad")
def _pad(b: Builder, node: Any, gy: G) -> G:
    if attr(node, "mode", "constant") != "constant":
        raise Unsupported(f"a Pad in mode {attr(node, 'mode')}")
    pads = b.constant(node.input[1]).astype(np.int64)
    rank = len(pads) // 2
    if len(node.input) > 3 and node.input[3]:
        raise Unsupported("a Pad with axes")
    starts = [int(p) for p in pads[:rank]]
    ends = [-int(p) if p > 0 else INT_MAX for p in pads[rank:]]
    if any(p < 0 for p in pads):
        raise Unsupported("a Pad that crops")
    return [b.op("Slice", gy[0], b.ints(starts), b.ints(ends), b.ints(list(range(rank)))), None, None]


@rule("Gather")
def _gather(b: Builder, node: Any, gy: G) -> G:
    """The gradient added back at the gathered positions along the axis (a ScatterElements of the
    gradient, its index axes merged into one; negative indices counted from the end)."""
    data, idx = node.input
    rank, k = len(b.shape(data)), len(b.shape(idx))
    axis = attr(node, "axis", 0) % rank
    shape = b.op("Shape", gy[0])
    merged = b.op("Concat", b.op("Slice", shape, b.ints([0]), b.ints([axis])), b.ints([-1]),
                  b.op("Slice", shape, b.ints([axis + k]), b.ints([rank + k])), axis=0)  # fmt: skip
    g = b.op("Reshape", gy[0], merged)  # [..., K, ...]: one position per gathered index
    flat = b.op("Reshape", idx, b.ints([1] * axis + [-1] + [1] * (rank - axis - 1)))
    size = b.op("Shape", data, start=axis, end=axis + 1)
    flat = _wrapped(b, flat, size)
    zeros = b.op("Mul", data, b.const(0.0))
    index = b.op("Expand", flat, b.op("Shape", g))
    return [b.op("ScatterElements", zeros, index, g, axis=axis, reduction="add"), None]
