"""Gradient rules of ONNX's recurrent operators (RNN, GRU, LSTM) for :mod:`.onnx_grad`.

The forward stays ONNX's own node. Its backward, per direction, is :mod:`.recurrent_onnx`'s (one
reverse ``Scan`` over time carrying the state gradients, the weight gradients as one product each
over all steps: nothing grows with the sequence length), given the layer in PyTorch's layout: the
direction's weights with their gates in PyTorch's order, its input and output sequences in the
order it runs them (a reverse direction's reversed), and the gradient of its final state added to
its last step's. The gradients come back in ONNX's layout, the directions' input gradients summed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import helper

from tasks.prepare.runtimes.autograd.onnx_grad import Builder, Unsupported, attr, rule
from tasks.prepare.runtimes.autograd.recurrent_graph import Graph
from tasks.prepare.runtimes.autograd.recurrent_onnx import ONNX_ORDER, backward_nodes

G = list[str | None]
INT_MIN = np.iinfo(np.int64).min


def _gates(b: Builder, w: str, order: list[int], axis: int) -> str:
    """``w``'s gate blocks (along ``axis``) in the order ``order`` picks them."""
    if len(order) == 1:
        return w
    parts = b.op("Split", w, outputs=len(order), axis=axis)
    return b.op("Concat", *(parts[k] for k in order), axis=axis)


def _reversed(b: Builder, x: str) -> str:
    return b.op("Slice", x, b.ints([-1]), b.ints([INT_MIN]), b.ints([0]), b.ints([-1]))


def _pick(b: Builder, x: str, d: int, axis: int) -> str:
    return b.op("Squeeze", b.op("Slice", x, b.ints([d]), b.ints([d + 1]), b.ints([axis])), b.ints([axis]))


def _zeros(b: Builder, like: str) -> str:
    return b.op("Mul", like, b.const(0.0))


@rule("RNN", "GRU", "LSTM")
def _recurrent(b: Builder, node: Any, gy: G) -> G:  # noqa: C901 - one direction's plumbing each way
    op = node.op_type
    inputs = [*node.input, *[""] * (8 - len(node.input))]
    x, w, r, bias, lens, h0, c0 = inputs[:7]
    if lens or (len(inputs) > 7 and inputs[7]) or attr(node, "clip") is not None or attr(node, "layout", 0):
        raise Unsupported(f"a {op} with sequence lengths, peepholes, clipping or batch-first layout")
    if op == "GRU" and not attr(node, "linear_before_reset", 0):
        raise Unsupported("a GRU without linear_before_reset (PyTorch's)")
    acts = [a.decode() if isinstance(a, bytes) else a for a in attr(node, "activations") or []]
    mode = {"GRU": "GRU", "LSTM": "LSTM"}.get(op) or ("RNN_RELU" if acts[:1] == ["Relu"] else "RNN_TANH")
    default = {"GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}.get(op, acts[:1] or ["Tanh"])
    if acts and any(a != default[i % len(default)] for i, a in enumerate(acts)):
        raise Unsupported(f"a {op} with activations other than PyTorch's")
    direction = attr(node, "direction", "forward")
    dirs = [direction == "reverse"] if direction != "bidirectional" else [False, True]
    gates = {"GRU": 3, "LSTM": 4}.get(op, 1)
    hidden = attr(node, "hidden_size")
    back = [int(i) for i in np.argsort(ONNX_ORDER[mode])] if mode in ONNX_ORDER else [0]
    y_seq = node.output[0] if node.output and node.output[0] else None
    if y_seq is None:
        raise Unsupported(f"a {op} whose output sequence is not kept")
    g_seq, g_last, g_cell = (gy + [None, None, None])[:3]
    steps = b.op("Shape", x, start=0, end=1)
    last = b.op("Cast", b.op("Equal", b.op("Range", b.const(0, np.int64), b.op("Squeeze", steps),
                                             b.const(1, np.int64)), b.op("Sub", b.op("Squeeze", steps), b.const(1, np.int64))), to=1)  # fmt: skip
    last = b.op("Unsqueeze", last, b.ints([1, 2]))  # [T, 1, 1]: 1 at the last step
    out: dict[str, list[str]] = {k: [] for k in ("x", "w", "r", "b", "h0", "c0")}
    for d, reverse in enumerate(dirs):
        flip = (lambda t: _reversed(b, t)) if reverse else (lambda t: t)
        xs, ys = flip(x), flip(_pick(b, y_seq, d, 1))
        gs = flip(_pick(b, g_seq, d, 1)) if g_seq else _zeros(b, ys)
        if g_last:
            gs = b.op("Add", gs, b.op("Mul", last, b.op("Unsqueeze", _pick(b, g_last, d, 0), b.ints([0]))))
        h_init = (
            _pick(b, h0, d, 0) if h0 else _zeros(b, b.op("Slice", ys, b.ints([0]), b.ints([1]), b.ints([0])))
        )
        if not h0:
            h_init = b.op("Squeeze", h_init, b.ints([0]))
        c_init = (_pick(b, c0, d, 0) if c0 else _zeros(b, h_init)) if op == "LSTM" else _zeros(b, h_init)
        gc = _pick(b, g_cell, d, 0) if (op == "LSTM" and g_cell) else _zeros(b, h_init)
        w_ih, w_hh = (_gates(b, _pick(b, t, d, 0), back, 0) for t in (w, r))
        if bias:
            b_ih, b_hh = b.op("Split", _pick(b, bias, d, 0), outputs=2, axis=0)
            b_ih, b_hh = _gates(b, b_ih, back, 0), _gates(b, b_hh, back, 0)
        else:
            b_ih = b_hh = b.op("ConstantOfShape", b.ints([gates * hidden]),
                               value=helper.make_tensor("", 1, [1], [0.0]))  # fmt: skip
        names = [b.fresh(f"{op}_grad") for _ in range(8)]
        fake = helper.make_node("LayerBackward", [gs, gc, xs, h_init, c_init, w_ih, w_hh, b_ih, b_hh, b.const(np.zeros([0], np.float32)), ys],
                                names, hidden_size=hidden, projected=0)  # fmt: skip
        g = Graph(b.fresh(f"{op}_back"), 17)
        backward_nodes(g, fake, mode)
        b.nodes.extend(g.nodes)
        gx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, _ = names
        out["x"].append(flip(gx))
        out["w"].append(_gates(b, dw_ih, ONNX_ORDER.get(mode, [0]), 0))
        out["r"].append(_gates(b, dw_hh, ONNX_ORDER.get(mode, [0]), 0))
        out["b"].append(
            b.op("Concat", *(_gates(b, t, ONNX_ORDER.get(mode, [0]), 0) for t in (db_ih, db_hh)), axis=0)
        )
        out["h0"].append(dh0)
        out["c0"].append(dc0)

    def stacked(parts: list[str]) -> str:
        return b.op("Concat", *(b.op("Unsqueeze", p, b.ints([0])) for p in parts), axis=0)

    gx = out["x"][0] if len(out["x"]) == 1 else b.op("Sum", *out["x"])
    grads: G = [gx, stacked(out["w"]), stacked(out["r"]), stacked(out["b"]) if bias else None, None,
                stacked(out["h0"]) if h0 else None, stacked(out["c0"]) if (op == "LSTM" and c0) else None]  # fmt: skip
    return grads[: len(node.input)]
