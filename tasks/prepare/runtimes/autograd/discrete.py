"""The orders a step computes (sort and top-k indices, argmax/argmin), taken from ONNX Runtime when
a step file is checked against its traced graph.

A loss that ranks float values (SSD's hard-negative mining sorts a detached loss and keeps
``rank < 3 * positives``) is discontinuous: where two values are equal up to rounding, ONNX Runtime
and PyTorch, which round the same float32 sums differently, may order them differently and choose
another prior, and the loss's gradients then differ far beyond any rounding (ssdlite_small: 0.2-0.9 %
of a head's bias gradient from 2 of 2 184 priors chosen otherwise, each a tie to 1 ulp).

So the step is exported with each order as an extra output (:func:`with_orders`, names from
:func:`order_name`: the correspondence is exact), and the check runs the traced graph with ONNX
Runtime's order wherever that order also sorts PyTorch's own values up to the check's tolerance
(:func:`run_pinned`). An order that is no such near-tie keeps PyTorch's, and the check of the
results judges. The step file written for the board has no extra outputs.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

ORDERS = {"sort": 1, "topk": 2}  # (values, indices) operators: the position of their dim argument
EXTREMA = {"argmax": np.max, "argmin": np.min}


def _op(node: Any) -> str:
    """The ATen operator name of a node (``sort`` of ``aten.sort.default``), else ''."""
    return node.target.__name__.split(".")[0] if hasattr(node.target, "_schema") else ""


def order_nodes(gm: Any) -> list[Any]:
    """The nodes of ``gm`` that are an order: the indices of a sort or top-k, an argmax/argmin."""
    nodes = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and node.args[1] == 1 and _op(node.args[0]) in ORDERS:
            nodes.append(node)
        elif _op(node) in EXTREMA:
            nodes.append(node)
    return nodes


def order_name(node: Any) -> str:
    """The extra output an order is exported as."""
    return f"order__{node.name}"


def with_orders(gm: Any, nodes: list[Any]) -> Any:
    """A copy of ``gm`` whose results are its own, then each node of ``nodes``."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    graph, copies = torch.fx.Graph(), {}
    results = graph.graph_copy(gm.graph, copies)
    graph.output((*results, *(copies[n] for n in nodes)))
    return torch.fx.GraphModule(gm, graph)


def _array(value: Any) -> np.ndarray:
    return value.detach().numpy() if hasattr(value, "detach") else np.asarray(value)


def _scale(x: np.ndarray) -> float:
    return max(1.0, float(np.abs(x).max())) if x.size else 1.0


def slack(node: Any, x: np.ndarray, ours: np.ndarray, theirs: np.ndarray) -> float:
    """How far ONNX Runtime's order ``theirs`` of the values ``x`` is from PyTorch's ``ours``
    in the values it picks, relative to the largest |x|."""
    if _op(node) in EXTREMA:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if dim is None:
            x, dim, keepdim = x.reshape(-1), 0, False
        keep = theirs if keepdim else np.expand_dims(theirs, dim)
        best = EXTREMA[_op(node)](x, axis=dim, keepdims=True)
        return float(np.abs(np.take_along_axis(x, keep, dim) - best).max()) / _scale(x)
    source = node.args[0]
    at = ORDERS[_op(source)]
    dim = source.args[at] if len(source.args) > at else source.kwargs.get("dim", -1)
    picked = np.take_along_axis(x, theirs, dim) - np.take_along_axis(x, ours, dim)
    return float(np.abs(picked).max()) / _scale(x) if picked.size else 0.0


def run_pinned(
    gm: Any, args: list[Any], theirs: dict[str, np.ndarray], rtol: float
) -> tuple[list[Any], list[str]]:
    """Run the traced graph ``gm`` on ``args`` with each order named in ``theirs`` (by
    :func:`order_name`) taking ONNX Runtime's value where it differs from PyTorch's only by
    near-ties of PyTorch's own values (:func:`slack` within ``rtol``): its results and the nodes
    whose order was taken from ONNX Runtime."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    differed: list[str] = []
    ordered: dict[str, Any] = {}  # the values each order ranks (the interpreter frees them after use)

    class Pinned(torch.fx.Interpreter):
        def run_node(self, node: Any) -> Any:
            if _op(node) in ORDERS or _op(node) in EXTREMA:
                ordered[node.name] = _array(self.env[node.args[0]])
            result = super().run_node(node)
            value = theirs.get(order_name(node))
            if value is None or value.shape != tuple(result.shape) or np.array_equal(_array(result), value):
                return result
            source = node if _op(node) in EXTREMA else node.args[0]
            if not slack(node, ordered[source.name], _array(result), value) <= rtol:
                return result
            differed.append(node.name)
            return torch.from_numpy(value.astype(_array(result).dtype))

    with torch.no_grad():
        results = Pinned(gm).run(*args)
    return list(results), differed
