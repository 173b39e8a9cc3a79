"""Gradient rules of the gathers and scatters (:mod:`.onnx_grad`): what boolean masks, sorting and
``gather``/``scatter`` export as.

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

from tasks.prepare.runtimes.autograd.onnx_grad import Builder, Unsupported, attr, rule

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
