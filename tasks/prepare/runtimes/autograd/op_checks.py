"""Each decomposition of :mod:`.decompositions` is checked on the configurations a model uses.

While a step is traced (:func:`recording`), every call of one of our decompositions records its
operator and arguments: tensor shapes (a symbolic size as the example's value), strides, paddings,
flags. :func:`check_recorded` then runs each distinct configuration once more, eagerly, on random
tensors of those shapes: our decomposition against PyTorch's own kernel for that operator. A
difference beyond float32 rounding is an ArtifactError naming the operator and configuration, before
any graph is written.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tasks.errors import ArtifactError
from tasks.prepare.runtimes.autograd.decompositions import own_table, table
from tasks.prepare.runtimes.autograd.fast_grads import example_size

RTOL = 1e-4  # of the largest |value| of PyTorch's result (float32 sums in another order)


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument as recorded: its shape (ints) and dtype."""

    shape: tuple[int, ...]
    dtype: Any


@dataclass(frozen=True)
class Use:
    """One configuration a decomposition was used with."""

    op: Any
    args: tuple[Any, ...]
    check: Callable[[Use, int], float] | None = None  # PyTorch's reference, where not op(*args) itself

    def describe(self) -> str:
        """``aten.x(float32[2, 3, 8, 8], stride [2, 2], ...)`` for messages."""
        words = [f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}" if isinstance(a, TensorArg) else repr(a)
                 for a in self.args]  # fmt: skip
        return f"{self.op}({', '.join(words)})"


_USES: contextvars.ContextVar[list[Use] | None] = contextvars.ContextVar(
    "odl_decomposition_uses", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[Use]]:
    """Record the uses of our decompositions in the block (nested blocks share the outer list)."""
    outer = _USES.get()
    uses: list[Use] = outer if outer is not None else []
    token = _USES.set(uses)
    try:
        yield uses
    finally:
        _USES.reset(token)


def record_use(op: Any, args: tuple[Any, ...], check: Callable[[Use, int], float]) -> None:
    """Record a use of an operator of ours that is not a decomposition (its shapes as the example's
    sizes), checked by ``check`` instead of against ``op`` itself (:func:`check_use`)."""
    uses = _USES.get()
    if uses is not None:
        uses.append(Use(op, tuple(_recorded_arg(a) for a in args), check))


def _recorded_arg(value: Any) -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if isinstance(value, torch.Tensor):
        return TensorArg(tuple(example_size(d) for d in value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_recorded_arg(v) for v in value)
    return value if value is None or isinstance(value, (bool, float, str)) else example_size(value)


def _recorder(op: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        uses, out = _USES.get(), fn(*args)
        if uses is not None and out is not NotImplemented:  # NotImplemented: PyTorch's operator itself
            uses.append(Use(op, tuple(_recorded_arg(a) for a in args)))
        return out

    return call


def recorded_table() -> dict[Any, Callable[..., Any]]:
    """:func:`.decompositions.table` with our own decompositions recording their uses."""
    out = table()
    out.update({op: _recorder(op, fn) for op, fn in own_table().items()})
    return out


def _materialised(value: Any, gen: Any) -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if isinstance(value, TensorArg) and not value.dtype.is_floating_point:  # indices: see _indexed
        return torch.zeros(value.shape, dtype=value.dtype)
    if isinstance(value, TensorArg):
        return torch.randn(value.shape, generator=gen, dtype=value.dtype)
    if isinstance(value, tuple):
        return [_materialised(v, gen) for v in value]
    return value


def check_use(use: Use, seed: int = 0) -> float:
    """Run ``use`` eagerly with our decomposition and with PyTorch's kernel; the largest difference
    relative to the kernel's largest value (ArtifactError when beyond :data:`RTOL`)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if use.check is not None:
        return use.check(use, seed)
    gen = torch.Generator().manual_seed(seed)
    args = _indexed(use.op, [_materialised(a, gen) for a in use.args])
    want, got = use.op(*args), own_table()[use.op](*args)
    pairs = [(w, g) for w, g in zip(_tuple(want), _tuple(got), strict=True) if w is not None]
    worst = 0.0
    for w, g in pairs:
        if g is None or tuple(g.shape) != tuple(w.shape):
            raise ArtifactError(f"the decomposition of {use.describe()} gives shape {None if g is None else list(g.shape)} "
                                f"where PyTorch gives {list(w.shape)}")  # fmt: skip
        scale = max(1.0, float(w.abs().max()))
        worst = max(worst, float((g - w).abs().max()) / scale)
    if not worst <= RTOL:
        raise ArtifactError(
            f"the decomposition of {use.describe()} differs from PyTorch's own kernel by {worst:.3g} "
            f"(relative; at most {RTOL} expected): this operator configuration cannot train with "
            "training.runtime = 'autograd' yet"
        )
    return worst


def _indexed(op: Any, args: list[Any]) -> list[Any]:
    """A max pool's backward takes its forward's indices (its last argument): they come from running
    that forward on the random input, as random integers would not be positions of maxima."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    aten = torch.ops.aten
    forwards = {
        aten.adaptive_max_pool2d_backward.default: lambda x, g: aten.adaptive_max_pool2d(
            x, list(g.shape[-2:])
        ),
        aten.adaptive_max_pool3d_backward.default: lambda x, g: aten.adaptive_max_pool3d(
            x, list(g.shape[-3:])
        ),
        aten.max_pool3d_with_indices_backward.default: lambda x, g: aten.max_pool3d_with_indices(
            x, *args[2:7]
        ),
        aten.max_pool2d_with_indices_backward.default: lambda x, g: aten.max_pool2d_with_indices(
            x, *args[2:7]
        ),
    }
    if op in forwards:
        args[-1] = forwards[op](args[1], args[0])[1]
    return args


def check_recorded(uses: list[Use]) -> dict[str, float]:
    """:func:`check_use` of each distinct configuration; ``{description: relative difference}``."""
    out: dict[str, float] = {}
    for use in uses:
        key = use.describe()
        if key not in out:
            out[key] = check_use(use)
    return out


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)
