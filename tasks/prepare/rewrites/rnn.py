"""Plain recurrent layers (ONNX RNN: ``nn.RNN`` with tanh or ReLU) in a training graph: ONNX
Runtime 1.19.2 has no gradient builder for RNN (it has LSTM and GRU training kernels only), so an RNN
a gradient flows through is unrolled over its steps into the operators it is made of.

For each direction, ``h_t = act(x_t W^T + h_{t-1} R^T + Wb + Rb)`` with ``h_{-1}`` the initial
state (zeros when the node has none): ``X W^T + Wb + Rb`` is one MatMul over the whole sequence,
then per step a Gather of the step, a MatMul by ``R^T``, an Add and the activation; the reverse
direction walks the steps backwards. ``Y`` stacks the states on the sequence and direction axes,
``Y_h`` holds each direction's last one. Weights are Gathers of the same trainable parameters, so
their names stay. The number of steps is the measured one (a fixed-length window); the rewrite is
checked against the node on random data, and a node it cannot take stays (ORT's own message then).
"""

from __future__ import annotations

import numpy as np
import onnx

from tasks.prepare.graph import attr
from tasks.prepare.rewrites.rewrite_kit import Builder, rewrite_each, same_values

ACTIVATIONS = {"tanh": "Tanh", "relu": "Relu"}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _direction(b: Builder, x: str, weights: tuple[str, str, str, str], k: int, backwards: bool, steps: int,
               act: str) -> list[str]:  # fmt: skip
    """The states ``h_t`` ([batch, hidden] each, in time order) of the node's ``k``-th direction."""
    w, r, bias, h0 = weights
    pick = b.const(f"direction{k}", k, np.int64)
    w_t = b.op("Transpose", [b.op("Gather", [w, pick], axis=0)], perm=[1, 0])
    r_t = b.op("Transpose", [b.op("Gather", [r, pick], axis=0)], perm=[1, 0])
    projected = b.op("MatMul", [x, w_t])  # [steps, batch, hidden]
    if bias:  # Wb and Rb side by side: [2 * hidden] -> [2, hidden] -> their sum
        halves = b.op("Reshape", [b.op("Gather", [bias, pick], axis=0), b.const("halves", [2, -1], np.int64)])
        summed = b.op("ReduceSum", [halves, b.const("axis0", [0], np.int64)], keepdims=0)
        projected = b.op("Add", [projected, summed])
    state = b.op("Gather", [h0, pick], axis=0) if h0 else ""
    states: list[str] = []
    for t in range(steps - 1, -1, -1) if backwards else range(steps):
        pre = b.op("Gather", [projected, b.const(f"step{t}", t, np.int64)], axis=0)
        if state:
            pre = b.op("Add", [pre, b.op("MatMul", [state, r_t])])
        state = b.op(act, [pre])
        states.append(state)
    return states[::-1] if backwards else states


def _rewrite(model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, list[int]]) -> Builder | None:
    inputs = list(node.input) + [""] * (6 - len(node.input))
    x, w, r, bias, seq_lens, h0 = inputs[:6]
    shape = shapes.get(x, [])
    direction = _text(attr(node, "direction", b"forward"))
    dirs = 2 if direction == "bidirectional" else 1
    acts = [_text(a).lower() for a in attr(node, "activations", [b"Tanh"] * dirs)]
    if seq_lens or attr(node, "layout", 0) != 0 or attr(node, "clip", None) is not None:
        return None
    if len(shape) != 3 or shape[0] <= 0 or any(a not in ACTIVATIONS for a in acts):
        return None
    b = Builder(model, node)
    axis0, axis1 = b.const("axis0", [0], np.int64), b.const("axis1", [1], np.int64)
    ys, last = [], []
    for k in range(dirs):
        backwards = direction == "reverse" or k == 1
        states = _direction(b, x, (w, r, bias, h0), k, backwards, shape[0], ACTIVATIONS[acts[k]])
        stacked = b.op("Concat", [b.op("Unsqueeze", [s, axis0]) for s in states], axis=0)
        ys.append(b.op("Unsqueeze", [stacked, axis1]))  # [steps, 1, batch, hidden]
        last.append(b.op("Unsqueeze", [states[0] if backwards else states[-1], axis0]))
    outs = list(node.output) + [""] * (2 - len(node.output))
    if outs[0]:
        b.op("Concat", ys, outs[0], axis=1)
    if outs[1]:
        b.op("Concat", last, outs[1], axis=0)
    return b if same_values(model, node, b, shapes, batch_first=False) else None


def rnns_unrolled(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Unroll every RNN node a gradient flows through (its input or weights computed from a
    trainable parameter); return how many."""
    return rewrite_each(model, {"RNN"}, _rewrite, trainable, any_input=True)
