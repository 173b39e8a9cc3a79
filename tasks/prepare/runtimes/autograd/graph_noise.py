"""The random operators of an exported step graph drawn from noise inputs, and PyTorch's step
drawing the same values for the check.

The TorchScript exporter writes a training-mode dropout as ``Dropout`` and a draw (``torch.rand``,
``rand_like``, ``randn``, ``randn_like``, ``bernoulli``: a drop path written by hand, say) as
``RandomUniform(Like)``, ``RandomNormal(Like)`` or ``Bernoulli``. Each becomes a new graph input of
uniform noise in [0, 1) of the tensor's shape (two for a normal draw), which the board fills from
(seed, step), and the few operators that make the draw of it: ``u < 1 - p`` scaled by
``1 / (1 - p)`` for a dropout's mask (as PyTorch keeps an element), ``u * (high - low) + low``,
Box-Muller for a normal draw, ``u < p`` for a Bernoulli one. :func:`replayed` makes PyTorch's
own step draw them from the same noise, in the order the graph draws them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tasks.prepare.runtimes.autograd.noise import NOISE_PREFIX, NoiseInput, box_muller
from tasks.prepare.runtimes.autograd.onnx_grad import Unsupported, attr

Shapes = dict[str, list[Any]]
UNIFORM, NORMAL = ("RandomUniform", "RandomUniformLike"), ("RandomNormal", "RandomNormalLike")
LOWERED = {"Dropout", "Bernoulli", *UNIFORM, *NORMAL}


class _Lowering:
    """The nodes, initializers and noise inputs that replace a graph's random operators."""

    def __init__(self, graph: Any, shapes: Shapes, types: dict[str, int]) -> None:
        self.graph, self.shapes, self.types = graph, shapes, types
        self.out: list[Any] = []
        self.noise: list[NoiseInput] = []

    def node(self, op: str, inputs: list[str], output: str, shape: list[Any], kind: int, **attrs: Any) -> str:
        self.out.append(helper.make_node(op, inputs, [output], **attrs))
        self.shapes[output], self.types[output] = list(shape), kind
        return output

    def const(self, name: str, value: float) -> str:
        self.graph.graph.initializer.append(numpy_helper.from_array(np.float32(value), name))
        return name

    def uniform(self, shape: list[Any], like: str | None) -> str:
        """A new noise input laid out as ``shape`` (``like``: a tensor of that shape); its name."""
        batched = [str(d).startswith("batch") for d in shape]
        if not shape or any(batched[1:]) or not (batched[0] or all(isinstance(d, int) for d in shape)):
            raise Unsupported("a random draw over a tensor whose first axis alone is not the batch")
        name = f"{NOISE_PREFIX}{len(self.noise)}"
        # the batch's rows; k rows a sample as [batch, k, ...]; a tensor without the batch (an
        # attention bias's, say) one draw for the whole batch, as PyTorch draws it
        rows = int(str(shape[0]).split("*")[1]) if batched[0] and shape[0] != "batch" else None
        drawn = ["batch", rows, *shape[1:]] if rows else list(shape)
        self.noise.append(NoiseInput(name, tuple(drawn)))
        self.graph.graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, drawn))
        self.shapes[name], self.types[name] = drawn, TensorProto.FLOAT
        if not rows:
            return name
        if like is None:
            raise Unsupported("a random draw of fixed shape over the batch's rows")
        size = self.node("Shape", [like], f"{name}/shape", [len(shape)], TensorProto.INT64)
        return self.node("Reshape", [name, size], f"{name}/rows", shape, TensorProto.FLOAT)

    def lower(self, node: Any, consts: dict[str, np.ndarray]) -> None:
        y, shape = node.output[0], self.shapes.get(node.output[0]) or []
        kind, like = self.types.get(y, TensorProto.FLOAT), node.input[0] if node.input else None
        p = f"{NOISE_PREFIX}{len(self.noise)}"
        if node.op_type == "Dropout":
            self._dropout(node, consts, shape)
        elif node.op_type in UNIFORM:
            low, high = attr(node, "low", 0.0), attr(node, "high", 1.0)
            u = self.uniform(shape, like)
            scaled = self.node("Mul", [u, self.const(f"{p}/range", high - low)], f"{p}/scaled", shape, 1)
            self._cast(
                self.node("Add", [scaled, self.const(f"{p}/low", low)], f"{p}/value", shape, 1), y, kind
            )
        elif node.op_type in NORMAL:
            u, v = self.uniform(shape, like), self.uniform(shape, like)
            one = self.node("Sub", [self.const(f"{p}/one", 1.0), u], f"{p}/1-u", shape, 1)
            log = self.node("Log", [one], f"{p}/log", shape, 1)
            r = self.node("Sqrt", [self.node("Mul", [log, self.const(f"{p}/-2", -2.0)], f"{p}/-2log", shape, 1)],
                          f"{p}/r", shape, 1)  # fmt: skip
            turn = self.node("Mul", [v, self.const(f"{p}/2pi", 2.0 * math.pi)], f"{p}/angle", shape, 1)
            z = self.node("Mul", [r, self.node("Cos", [turn], f"{p}/cos", shape, 1)], f"{p}/z", shape, 1)
            scaled = self.node(
                "Mul", [z, self.const(f"{p}/scale", attr(node, "scale", 1.0))], f"{p}/sz", shape, 1
            )
            self._cast(self.node("Add", [scaled, self.const(f"{p}/mean", attr(node, "mean", 0.0))], f"{p}/value",
                                 shape, 1), y, kind)  # fmt: skip
        else:  # Bernoulli: 1 where u < p
            prob = self.node("Cast", [node.input[0]], f"{p}/p", shape, 1, to=TensorProto.FLOAT)
            keep = self.node("Less", [self.uniform(shape, like), prob], f"{p}/keep", shape, TensorProto.BOOL)
            self._cast(keep, y, kind)

    def _cast(self, value: str, y: str, kind: int) -> None:
        self.node("Cast", [value], y, self.shapes.get(y) or [], kind, to=kind)

    def _dropout(self, node: Any, consts: dict[str, np.ndarray], shape: list[Any]) -> None:
        given = [node.input[i] if len(node.input) > i and node.input[i] else None for i in (1, 2)]
        if any(g is not None and g not in consts for g in given):
            raise Unsupported("a Dropout whose ratio or mode is computed")
        ratio = float(consts[given[0]]) if given[0] else 0.5
        x, y = node.input[0], node.output[0]
        if not (given[1] and bool(consts[given[1]])) or ratio == 0.0:
            self.out.append(helper.make_node("Identity", [x], [y]))
            return
        shape = self.shapes.get(x) or []
        p = f"{NOISE_PREFIX}{len(self.noise)}"
        keep = self.node(
            "Less", [self.uniform(shape, x), self.const(f"{p}/p", 1.0 - ratio)], f"{p}/keep", shape, 9
        )
        kept = self.node("Cast", [keep], f"{keep}/f", shape, 1, to=TensorProto.FLOAT)
        mask = self.node("Mul", [kept, self.const(f"{p}/s", 1.0 / (1.0 - ratio))], f"{p}/mask", shape, 1)
        self.out.append(helper.make_node("Mul", [x, mask], [y]))


def lower_random(graph: Any, shapes: Shapes, types: dict[str, int]) -> list[NoiseInput]:
    """Each training-mode Dropout and each random draw of ``graph`` made of a new noise input
    (``shapes`` and ``types`` extended with the new tensors); the noise inputs, in the graph's order."""
    consts = {
        n.output[0]: numpy_helper.to_array(attr(n, "value"))
        for n in graph.graph.node
        if n.op_type == "Constant"
    }
    consts |= {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer}
    lowering = _Lowering(graph, shapes, types)
    for node in graph.graph.node:
        if node.op_type in LOWERED:
            lowering.lower(node, consts)
        else:
            lowering.out.append(node)
    del graph.graph.node[:]
    graph.graph.node.extend(lowering.out)
    return lowering.noise


@contextlib.contextmanager
def replayed(noise: list[np.ndarray]) -> Iterator[Any]:
    """Within the block, PyTorch's ``dropout`` and random draws take their values from ``noise``
    (the step's noise inputs, in order), as :func:`lower_random` makes the graph take them; yields
    a function that is Unsupported when a noise input was left over. Unsupported for a draw the
    export did not write as a noise input."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    draws = iter(noise)
    saved = {"dropout": torch.nn.functional.dropout, "rand": torch.rand, "rand_like": torch.rand_like,
             "randn": torch.randn, "randn_like": torch.randn_like, "bernoulli": torch.bernoulli}  # fmt: skip

    def take(shape: tuple[int, ...], what: str) -> Any:
        u = next(draws, None)
        if u is not None and u.size == math.prod(shape) and u.shape[1:] != tuple(shape[1:]):
            u = u.reshape(shape)  # k rows a sample
        if u is None or u.shape[1:] != tuple(shape[1:]):
            raise Unsupported(f"a {what} the export did not write as a noise input")
        return torch.from_numpy(u)

    def dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if not training or p == 0.0:
            return x
        return x * (take(tuple(x.shape), "dropout") < 1.0 - p).to(x.dtype) * (1.0 / (1.0 - p))

    def sizes(size: tuple[Any, ...]) -> tuple[int, ...]:
        flat = size[0] if len(size) == 1 and not isinstance(size[0], int) else size
        return tuple(int(s) for s in flat)

    def rand(*size: Any, dtype: Any = None, **_: Any) -> Any:
        return take(sizes(size), "draw").to(dtype or torch.get_default_dtype())

    def randn(*size: Any, dtype: Any = None, **_: Any) -> Any:
        shape = sizes(size)
        return box_muller(take(shape, "draw"), take(shape, "draw")).to(dtype or torch.get_default_dtype())

    def rand_like(x: Any, dtype: Any = None, **_: Any) -> Any:
        return take(tuple(x.shape), "draw").to(dtype or x.dtype)

    def randn_like(x: Any, dtype: Any = None, **_: Any) -> Any:
        return box_muller(take(tuple(x.shape), "draw"), take(tuple(x.shape), "draw")).to(dtype or x.dtype)

    def bernoulli(x: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return saved["bernoulli"](x, *args, **kwargs)
        return (take(tuple(x.shape), "draw") < x.detach().float()).to(x.dtype)

    def left() -> None:
        if next(draws, None) is not None:
            raise Unsupported("a random draw the model did not make through the functions replayed here")

    torch.nn.functional.dropout = dropout
    torch.rand, torch.rand_like, torch.randn, torch.randn_like = rand, rand_like, randn, randn_like
    torch.bernoulli = bernoulli
    try:
        yield left
    finally:
        torch.nn.functional.dropout = saved["dropout"]
        torch.rand, torch.rand_like = saved["rand"], saved["rand_like"]
        torch.randn, torch.randn_like, torch.bernoulli = (
            saved["randn"],
            saved["randn_like"],
            saved["bernoulli"],
        )
