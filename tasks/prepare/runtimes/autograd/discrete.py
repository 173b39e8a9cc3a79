"""The orders a step computes (sort and top-k indices, argmax/argmin) and its decisions (comparisons
of float values: a ReLU's mask in its backward, a max pool's first maximum), taken from ONNX Runtime
when a step file is checked against its traced graph.

A loss that ranks float values (SSD's hard-negative mining sorts a detached loss and keeps
``rank < 3 * positives``) is discontinuous: where two values are equal up to rounding, ONNX Runtime
and PyTorch, which round the same float32 sums differently, may order them differently and choose
another prior, and the loss's gradients then differ far beyond any rounding (ssdlite_small: 0.2-0.9 %
of a head's bias gradient from 2 of 2 184 priors chosen otherwise, each a tie to 1 ulp).

A comparison is the same discontinuity at one element: timm's SelecSLS-42 has a ReLU whose input is
3.3e-5 in float64 (of values up to 3.1), at or below 0 in PyTorch's float32 and above it in ONNX
Runtime's; the backward's mask ``x > 0`` lets that sample's gradient through one side only, and the
head conv's weight gradient differed by 1.5e-2 (0.29 of its largest value) where ONNX Runtime's was
within 2e-6 of float64.

So the step is exported with each order and decision as an extra output (:func:`with_orders`, names from
:func:`order_name`: the correspondence is exact), and the check runs the traced graph with ONNX
Runtime's order wherever that order also sorts PyTorch's own values up to the check's tolerance
(:func:`run_pinned`), and ONNX Runtime's decision wherever the compared values are that close at
each element it decides otherwise. An order or decision that is no such near-tie keeps PyTorch's,
and the check of the results judges. The step file written for the board has no extra outputs.

A graph step (:mod:`.graph_step`) is checked against PyTorch's own eager step instead: its TopK
indices (:func:`order_outputs`) are fetched from the check's run and PyTorch's sorts, argsorts and
top-k, call by call, take them at near-ties (:func:`eager_pinned`), as its activations take ONNX
Runtime's decisions (:mod:`.graph_decisions`). The wiki's SSD-Lite at 96 px (recipes/ssdlite_wiki.py):
its graph step differed from PyTorch by 3e-3 to 1.2e-2 (6 of 6 initialisations: a few of 2 184
priors mined otherwise), so each preparation ran PyTorch's step again in float64 to judge it;
pinned, it differs by 4e-7 to 1.3e-6.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ORDERS = {"sort": 1, "topk": 2}  # (values, indices) operators: the position of their dim argument
EXTREMA = {"argmax": np.max, "argmin": np.min}
DECISIONS = {"gt", "ge", "lt", "le", "eq", "ne"}  # comparisons, pinned when they compare float values


def _op(node: Any) -> str:
    """The ATen operator name of a node (``sort`` of ``aten.sort.default``), else ''."""
    target = getattr(node, "target", None)
    return target.__name__.split(".")[0] if hasattr(target, "_schema") else ""


def _floating(value: Any) -> bool:
    """Whether an FX node argument is a float tensor (by its traced example value)."""
    val = getattr(value, "meta", {}).get("val")
    return getattr(getattr(val, "dtype", None), "is_floating_point", False)


def order_nodes(gm: Any) -> list[Any]:
    """The nodes of ``gm`` that are an order (the indices of a sort or top-k, an argmax/argmin) or a
    decision (a comparison of float values)."""
    nodes = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and node.args[1] == 1 and _op(node.args[0]) in ORDERS:
            nodes.append(node)
        elif _op(node) in EXTREMA or (_op(node) in DECISIONS and _floating(node.args[0])):
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
    """The largest finite |x|, at least 1 (an order may rank infinities written into its values)."""
    finite = np.abs(x[np.isfinite(x)])
    return max(1.0, float(finite.max())) if finite.size else 1.0


def slack(node: Any, x: Any, ours: np.ndarray, theirs: np.ndarray) -> float:
    """How far ONNX Runtime's order ``theirs`` of the values ``x`` is from PyTorch's ``ours``
    in the values it picks, relative to the largest |x|; for a decision (``x`` the pair compared;
    for a ReLU's output, which is 0 wherever its input is at or below 0, that input), the largest
    gap between the pair where the two decide otherwise, relative to the largest |value|."""
    if _op(node) in DECISIONS:
        a, b = (np.asarray(v, dtype=np.float64) for v in x)
        gap = np.broadcast_to(np.abs(a - b), ours.shape)[ours != theirs]
        return float(gap.max()) / max(_scale(a), _scale(b)) if gap.size else 0.0
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
    return order_slack(x, ours, theirs, dim)


def order_slack(x: np.ndarray, ours: np.ndarray, theirs: np.ndarray, dim: int) -> float:
    """How far the order ``theirs`` of ``x`` along ``dim`` is from ``ours`` in the values it picks,
    relative to the largest finite |x|."""
    a, b = np.take_along_axis(x, theirs, dim), np.take_along_axis(x, ours, dim)
    with np.errstate(invalid="ignore"):  # equal infinities (-inf written by a mask) are a tie
        picked = np.where(a == b, 0.0, np.abs(a - b))
    return float(picked.max()) / _scale(x) if picked.size else 0.0


def run_pinned(
    gm: Any, args: list[Any], theirs: dict[str, np.ndarray], rtol: float, wide: bool = False
) -> tuple[list[Any], list[str]]:
    """Run the traced graph ``gm`` on ``args`` with each order or decision named in ``theirs`` (by
    :func:`order_name`) taking ONNX Runtime's value where it differs from PyTorch's only by
    near-ties of PyTorch's own values (:func:`slack` within ``rtol``): its results and the nodes
    whose value was taken from ONNX Runtime. ``wide``: in float64 (every float32 tensor and dtype an
    operator is given as float64), the reference float32 rounding is measured against."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    differed: list[str] = []
    ordered: dict[str, Any] = {}  # the values each order ranks (the interpreter frees them after use)
    decided = [n for n in gm.graph.nodes if _op(n) in DECISIONS and order_name(n) in theirs]
    clipped = {n.args[0] for n in decided if _op(n.args[0]) == "relu"}

    class Pinned(torch.fx.Interpreter):
        def run_node(self, node: Any) -> Any:
            values = None
            if _op(node) in ORDERS or _op(node) in EXTREMA or node in clipped:
                ordered[node.name] = _array(self.env[node.args[0]])
            elif _op(node) in DECISIONS and order_name(node) in theirs:
                pair = [_array(a) for a in self.fetch_args_kwargs_from_env(node)[0][:2]]
                values = [ordered.get(node.args[0].name, pair[0]), pair[1]]  # a ReLU's: its input
            result = super().run_node(node)
            value = theirs.get(order_name(node))
            if value is None or value.shape != tuple(result.shape) or np.array_equal(_array(result), value):
                return result
            if values is None:
                values = ordered[(node if _op(node) in EXTREMA else node.args[0]).name]
            if not slack(node, values, _array(result), value) <= rtol:
                return result
            differed.append(node.name)
            return torch.from_numpy(value.astype(_array(result).dtype))

        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            if wide:
                args, kwargs = _widened(args, torch), _widened(kwargs, torch)
            return super().call_function(target, args, kwargs)

    if wide:
        args = _widened(list(args), torch)
    with torch.no_grad():
        results = Pinned(gm).run(*args)
    return list(results), differed


def _widened(value: Any, torch: Any) -> Any:
    """``value`` (a node's arguments) with float32 dtypes and tensors as float64."""
    if value is torch.float32:
        return torch.float64
    if isinstance(value, torch.Tensor):
        return value.double() if value.dtype == torch.float32 else value
    if isinstance(value, (list, tuple)):
        return type(value)(_widened(v, torch) for v in value)
    if isinstance(value, dict):
        return {k: _widened(v, torch) for k, v in value.items()}
    return value


def order_outputs(graph: Any) -> list[str]:
    """The indices output of each ``TopK`` of an ONNX step ``graph`` (``sort``, ``argsort`` and
    ``topk`` as the TorchScript exporter writes them), in the graph's order."""
    return [
        n.output[1] for n in graph.graph.node if n.op_type == "TopK" and len(n.output) > 1 and n.output[1]
    ]


@dataclass
class Orders:
    """ONNX Runtime's indices of each TopK of a graph step (in the graph's order), and which of
    PyTorch's calls :func:`eager_pinned` gave them to."""

    values: list[np.ndarray]
    pinned: list[int] = field(default_factory=list)


# PyTorch's ordering functions and where each takes its dim: (position, default)
EAGER_ORDERS = {"sort": (1, -1), "argsort": (1, -1), "topk": (2, -1)}


@contextlib.contextmanager
def eager_pinned(orders: Orders | None, rtol: float) -> Iterator[None]:
    """In the block, the n-th ``sort``, ``argsort`` or ``topk`` PyTorch computes takes the n-th
    TopK's indices of ``orders`` (the exporter writes them in the order of the calls) where those
    differ from PyTorch's only by near-ties of PyTorch's own values (:func:`order_slack` within
    ``rtol``): its values are then gathered at them, so autograd follows that order. A call whose
    TopK has another shape keeps PyTorch's order (the check of the results judges); the calls
    pinned are recorded in ``orders.pinned``."""
    if orders is None or not orders.values:
        yield
        return
    import torch  # torch (heavy) only when a PyTorch model is built or run
    from torch.overrides import TorchFunctionMode

    names = {getattr(owner, n): n for owner in (torch, torch.Tensor) for n in EAGER_ORDERS}
    calls = iter(range(len(orders.values)))
    orders.pinned = []

    class Pinned(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            name = names.get(func)
            at = next(calls, None) if name else None
            if at is None:
                return result
            x, indices = args[0], result if name == "argsort" else result[1]
            position, default = EAGER_ORDERS[name]
            dim = args[position] if len(args) > position else kwargs.get("dim", default)
            theirs, ours = orders.values[at], _array(indices)
            if theirs.shape != ours.shape or np.array_equal(theirs, ours):
                return result
            if not order_slack(_array(x).astype(np.float64), ours, theirs, dim) <= rtol:
                return result
            orders.pinned.append(at)
            chosen = torch.from_numpy(theirs)
            return chosen if name == "argsort" else type(result)((x.gather(dim, chosen), chosen))

    with Pinned():
        yield
