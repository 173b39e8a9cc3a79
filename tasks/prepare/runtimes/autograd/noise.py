"""Random operators of a traced step become inputs: the board draws them from (seed, step).

A dropout mask, a dropped path or a SpecAugment mask is drawn inside the graph by an ONNX Runtime
generator that no plain ``InferenceSession`` lets anyone reseed per step, so a resumed job could not
repeat an uninterrupted one. Every random operator of the traced step (``rand``, ``rand_like``,
``bernoulli``, ``uniform``, ``randn``, ``normal``, ... whichever layer or library drew it) is
replaced by a new graph input of uniform noise in [0, 1) of its shape, and the few operators that
turn it into what the operator drew (``u < p`` for a Bernoulli draw, Box-Muller for a normal one).
The board's step fills these inputs from a generator seeded by the job's seed and the step number.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tasks.errors import ModelError

NOISE_PREFIX = "noise."


@dataclass(frozen=True)
class NoiseInput:
    """One noise input: its name and shape (``"batch"`` for the batch axis)."""

    name: str
    shape: tuple[int | str, ...]

    def to_dict(self) -> dict[str, Any]:
        """As step.json lists it (dtype float32, uniform in [0, 1))."""
        return {"name": self.name, "shape": list(self.shape), "dtype": "float32"}


def _builders() -> dict[Any, tuple[int, Any]]:
    """Random operator -> (uniform inputs it takes, how its value is built from them and its args)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    aten = torch.ops.aten

    def uniform(node: Any, u: list[Any]) -> Any:
        if node.target is not aten.uniform.default:
            return u[0].to(node.meta["val"].dtype)
        low = node.args[1] if len(node.args) > 1 else node.kwargs.get("from", 0.0)
        high = node.args[2] if len(node.args) > 2 else node.kwargs.get("to", 1.0)
        return (u[0] * (high - low) + low).to(node.meta["val"].dtype)

    def bernoulli_p(node: Any, u: list[Any]) -> Any:
        p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        return (u[0] < p).to(node.meta["val"].dtype)

    def bernoulli(node: Any, u: list[Any]) -> Any:
        return (u[0] < node.args[0]).to(node.meta["val"].dtype)

    def normal(node: Any, u: list[Any]) -> Any:
        z = box_muller(u[0], u[1])
        if node.target is aten.normal.float_float:
            z = z * node.args[1] + node.args[0]
        return z.to(node.meta["val"].dtype)

    table = {
        aten.rand.default: (1, uniform),
        aten.rand_like.default: (1, uniform),
        aten.uniform.default: (1, uniform),
        aten.bernoulli.p: (1, bernoulli_p),
        aten.bernoulli.default: (1, bernoulli),
        aten.randn.default: (2, normal),
        aten.randn_like.default: (2, normal),
        aten.normal.float_float: (2, normal),
    }
    return table


def box_muller(u: Any, v: Any) -> Any:
    """A standard normal draw from two uniform ones in [0, 1) (torch tensors or traced proxies)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    return torch.sqrt(-2.0 * torch.log(1.0 - u)) * torch.cos(2.0 * torch.pi * v)


RANDOM_WORDS = ("rand", "bernoulli", "normal", "uniform", "multinomial", "dropout", "poisson", "exponential")


def replace_random(gm: Any, batch_symbol: Any, layer_of: Any) -> list[NoiseInput]:
    """Replace every random node of ``gm`` by noise placeholders (appended after its inputs) and
    the operators that make the draw of them; the noise inputs, in placeholder order. ModelError
    for a random operator without a replacement or a draw of a shape :func:`_shape` refuses."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    builders, graph = _builders(), gm.graph
    noise: list[NoiseInput] = []
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = node.target
        if target not in builders:
            if any(w in str(target) for w in RANDOM_WORDS) and "backward" not in str(target):
                raise ModelError(f"{layer_of(node)} draws random numbers with {target}, which the autograd runtime "
                                 "cannot replay yet: use training.runtime = 'ort-training'")  # fmt: skip
            continue
        count, build = builders[target]
        shape, view = _shape(node, batch_symbol, layer_of)
        placeholders = []
        last = [n for n in graph.nodes if n.op == "placeholder"][-1]
        for _ in range(count):
            name = f"{NOISE_PREFIX}{len(noise)}"
            with graph.inserting_after(last):
                last = graph.placeholder(name.replace(".", "_"))
            noise.append(NoiseInput(name, shape))
            placeholders.append(last)
        with graph.inserting_before(node):
            if view is not None:  # (batch, k) noise laid out as the draw's shape
                placeholders = [
                    graph.call_function(torch.ops.aten.reshape.default, (p, view)) for p in placeholders
                ]
            value = _traced(build, node, placeholders)
        node.replace_all_uses_with(value)
        graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return noise


def _traced(build: Any, node: Any, placeholders: list[Any]) -> Any:
    """The FX nodes of ``build(node, uniforms)``, traced with the placeholders as proxies."""
    import torch.fx  # torch (heavy) only when a PyTorch model is built or run

    tracer = torch.fx.proxy.GraphAppendingTracer(node.graph)
    proxies = [torch.fx.Proxy(p, tracer) for p in placeholders]
    return build(node, proxies).node


def _shape(node: Any, batch_symbol: Any, layer_of: Any) -> tuple[tuple[int | str, ...], list[int] | None]:
    """The noise input's shape for a draw, and the view that lays it out as the draw (None: as is).

    The tracer makes every size a symbol; only the batch stays one. A draw of sizes that are the
    batch or fixed is a noise input of that shape (``"batch"`` for the batch). A draw whose elements
    are the batch times a fixed count through arithmetic on one axis (patches folded into the batch:
    ``4 * batch``; ``batch * h * w`` rows) is a ``("batch", count)`` input viewed in the graph as the
    draw, that axis ``-1``, so the step takes any batch. ModelError for any other shape."""
    sizes = list(node.meta["val"].shape)
    exprs = [getattr(d, "node", None) for d in sizes]
    exprs = [int(d) if e is None else e.expr for d, e in zip(sizes, exprs, strict=True)]
    if all(e == batch_symbol or not _depends(e, batch_symbol) for e in exprs):
        return tuple(
            "batch" if e == batch_symbol else _fixed(d) for e, d in zip(exprs, sizes, strict=True)
        ), None
    batched = [i for i, e in enumerate(exprs) if _depends(e, batch_symbol)]
    values = {k: v for k, v in sizes[batched[0]].node.shape_env.var_to_val.items() if k != batch_symbol}
    count = (math.prod(exprs[i] for i in batched) / batch_symbol).subs(values)  # the fixed sizes' values
    fixed = math.prod(_fixed(d) for i, d in enumerate(sizes) if i not in batched)
    if len(batched) == 1 and not _depends(count, batch_symbol) and count.is_integer and count > 0:
        view = [-1 if i in batched else _fixed(d) for i, d in enumerate(sizes)]
        return ("batch", int(count) * fixed), view
    named = {**values, batch_symbol: type(batch_symbol)("batch")}
    shown = [
        str(e.xreplace(named)) if _depends(e, batch_symbol) else str(_fixed(d))
        for e, d in zip(exprs, sizes, strict=True)
    ]
    raise ModelError(f"{layer_of(node)} draws random numbers of shape [{', '.join(shown)}]: the autograd runtime "
                     "replays draws whose sizes are the batch, fixed, or one size that is a fixed multiple of "
                     "the batch")  # fmt: skip


def _depends(expr: Any, batch_symbol: Any) -> bool:
    return batch_symbol in getattr(expr, "free_symbols", ())


def _fixed(size: Any) -> int:
    """A size that does not depend on the batch: its example value."""
    sym = getattr(size, "node", None)
    return int(size) if sym is None else int(sym.hint)


@contextlib.contextmanager
def dropout_masks(model: Any) -> Iterator[int]:
    """While the block runs, each ``nn.Dropout`` of ``model`` in training mode (0 < p < 1) keeps
    ``rand_like(x) > p`` and scales it by ``1 / (1 - p)``, exactly as PyTorch's decomposition of
    ``aten.native_dropout`` draws and computes it; yields how many. Traced so, the forward needs no
    decomposition pass before ``make_fx`` (``aten.dropout``'s own kernel asks a symbolic batch for
    its element count); each module's own forward is given back at the end."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    found = [m for m in model.modules() if type(m) is torch.nn.Dropout and m.training and 0 < m.p < 1]

    def masked(x: Any, p: float) -> Any:
        return (torch.rand_like(x) > p) * x * (1.0 / (1.0 - p))

    for m in found:
        m.forward = lambda x, p=m.p: masked(x, p)
    try:
        yield len(found)
    finally:
        for m in found:
            del m.forward
