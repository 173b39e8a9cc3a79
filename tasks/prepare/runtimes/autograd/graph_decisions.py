"""The activations' decisions of an exported step graph (``Relu``, ``Clip``), taken from ONNX Runtime
at near-ties when PyTorch's own step is computed for the check.

A ReLU or a clamp decides per element whether its gradient passes (``x > 0``; ``lo < x < hi`` for
``hardtanh`` and ReLU6, ``lo <= x <= hi`` for ``clamp``, where the graph's ``Clip`` rule, not
knowing which it was, passes nothing at a bound). Where an input is within rounding of a bound, ONNX Runtime's float32 forward and PyTorch's, which round the same sums differently, may
decide otherwise, and one element's gradient then reaches every earlier layer: smp's U-Net on a
MobileNetV2 encoder (64 px, BatchNorm statistics calibrated on 64 images) has three such elements
among 35 ReLU6 and 10 ReLU inputs (each within 6e-6 of 0, of values up to 30); ONNX Runtime's
gradients of the early layers differed from PyTorch's float32 ones by 1.8 % and from float64 by
0.3 %, 2.4x PyTorch's own distance, and the model went to the traced step (54 s more). With the
decisions pinned, the two differ by 1.1e-4, each within 6e-5 of float64.

So the check fetches each forward ``Relu``'s and ``Clip``'s input from ONNX Runtime's run
(:func:`decision_inputs`: their names in the graph's order), and PyTorch's step (in float32, and
in float64 for the judgement) runs under :func:`pinned`: its k-th call of ``relu``, ``relu6``,
``hardtanh``, ``clamp`` or ``clip`` is the graph's k-th such node, and its backward lets a gradient
through as PyTorch decides except at the elements ONNX Runtime decided otherwise within ``rtol``
of the input's largest value, where ONNX Runtime's decision holds (the traced steps' check pins
its comparisons alike: :mod:`.discrete`). When the calls and the nodes do not pair up one to one
by kind and shape (the exporter merged two equal calls, say), nothing is pinned.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("Relu", "Clip")  # the ONNX operators whose backward decides per element


def decision_inputs(graph: Any) -> list[tuple[str, str]]:
    """``(kind, input name)`` of each ``Relu`` and ``Clip`` node of ``graph``, in its order (called
    on the forward graph, before the backward is added)."""
    return [(n.op_type, n.input[0]) for n in graph.graph.node if n.op_type in KINDS]


@dataclass
class Decisions:
    """ONNX Runtime's input of each decision node (``kinds``, ``values`` in the graph's order); what
    :func:`pinned` did with them: whether the calls paired up, how many elements it pinned."""

    kinds: list[str]
    values: list[np.ndarray]
    matched: bool = True
    pinned: int = 0
    calls: int = 0
    at: list[int] = field(default_factory=list)


def _bounds(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, bool, bool]:
    """``(low, high, inclusive, in place)`` of a call of the family ``name``."""

    def arg(i: int, key: str, default: Any) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name in ("relu", "relu_"):
        return 0.0, None, False, name == "relu_" or bool(arg(1, "inplace", False))
    if name == "relu6":
        return 0.0, 6.0, False, bool(arg(1, "inplace", False))
    if name in ("hardtanh", "hardtanh_"):
        low, high = arg(1, "min_val", -1.0), arg(2, "max_val", 1.0)
        return low, high, False, name == "hardtanh_" or bool(arg(3, "inplace", False))
    return arg(1, "min", None), arg(2, "max", None), True, name.endswith("_")  # clamp, clip


def _families(torch: Any) -> dict[Any, tuple[str, str]]:
    """Each intercepted function -> (the ONNX node kind it exports as, its family's name)."""
    f, t = torch.nn.functional, torch.Tensor
    pairs = [(f.relu, "relu"), (torch.relu, "relu"), (t.relu, "relu"), (torch.relu_, "relu_"), (t.relu_, "relu_"),
             (f.relu6, "relu6"), (f.hardtanh, "hardtanh"), (f.hardtanh_, "hardtanh_")]  # fmt: skip
    for name in ("clamp", "clip"):
        pairs += [(getattr(torch, name), name), (getattr(t, name), name)]
        pairs += [(getattr(torch, f"{name}_"), f"{name}_"), (getattr(t, f"{name}_"), f"{name}_")]
    return {
        fn: ("Relu" if name.startswith("relu") and name != "relu6" else "Clip", name) for fn, name in pairs
    }


def _scalar(value: Any) -> float | None | bool:
    """A bound as a float (None: no bound); False for a bound no scalar gives (a tensor of many)."""
    if value is None:
        return None
    if hasattr(value, "numel"):
        return float(value) if value.numel() == 1 else False
    return float(value)


def _passes(x: Any, low: float | None, high: float | None, inclusive: bool) -> Any:
    """Where the gradient passes: inside the bounds (or at them, ``inclusive``)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    keep = torch.ones_like(x, dtype=torch.bool)
    if low is not None:
        keep &= x >= low if inclusive else x > low
    if high is not None:
        keep &= x <= high if inclusive else x < high
    return keep


def _kept(x: Any, theirs: np.ndarray, low: float | None, high: float | None, inclusive: bool,
          rtol: float) -> tuple[Any, int]:  # fmt: skip
    """PyTorch's decision on ``x`` with ONNX Runtime's (on ``theirs``) at the elements they decide
    otherwise where both inputs are within ``rtol`` of ``x``'s largest |value| of a bound; the
    number of elements taken from it."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    with torch.no_grad():
        value, their = x.detach(), torch.from_numpy(theirs).to(x.dtype)
        # the graph's rules pass nothing at a bound (hardtanh's convention; clamp's passes there)
        ours, other = _passes(value, low, high, inclusive), _passes(their, low, high, False)
        finite = value[torch.isfinite(value)].abs()
        scale = max(1.0, float(finite.max())) if finite.numel() else 1.0
        near = ours != other
        for v in (value, their):  # both within rtol of a bound
            gap = torch.full_like(value, math.inf)
            for bound in (low, high):
                if bound is not None:
                    gap = torch.minimum(gap, (v - bound).abs())
            near &= gap <= rtol * scale
        return torch.where(near, other, ours).to(value.dtype), int(near.sum())


@contextlib.contextmanager
def pinned(decisions: Decisions | None, rtol: float) -> Iterator[None]:
    """Within the block, PyTorch's ``relu``, ``relu6``, ``hardtanh``, ``clamp`` and ``clip`` calls
    let their gradient through as ONNX Runtime decided at near-ties (module docstring); records in
    ``decisions`` whether the calls paired up with its nodes and how many elements were pinned."""
    if decisions is None:
        yield
        return
    import torch  # torch (heavy) only when a PyTorch model is built or run
    from torch.overrides import TorchFunctionMode

    decisions.matched, decisions.pinned, decisions.calls, decisions.at = True, 0, 0, []
    families = _families(torch)

    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, keep: Any, low: float | None, high: float | None) -> Any:
            ctx.save_for_backward(keep)
            return x.clamp(low, high)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (keep,) = ctx.saved_tensors
            return grad * keep, None, None, None

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            family = families.get(func)
            if family is None:
                return func(*args, **kwargs)
            k, x = decisions.calls, args[0]
            decisions.calls += 1
            ok = k < len(decisions.kinds) and decisions.kinds[k] == family[0]
            if not ok or tuple(decisions.values[k].shape) != tuple(x.shape):
                decisions.matched = False
            low, high, inclusive, inplace = _bounds(family[1], args, kwargs)
            low, high = _scalar(low), _scalar(high)
            if not decisions.matched or low is False or high is False or not x.is_floating_point() \
                    or not (torch.is_grad_enabled() and x.requires_grad):  # fmt: skip
                return func(*args, **kwargs)
            keep, count = _kept(x, decisions.values[k], low, high, inclusive, rtol)
            if count:
                decisions.pinned += count
                decisions.at.append(k)
            y = Kept.apply(x, keep, low, high)
            return x.copy_(y) if inplace else y

    with Mode():
        yield
    if decisions.calls != len(decisions.kinds):
        decisions.matched = False
