"""Bidirectional LSTMs in a training graph: ONNX Runtime 1.19.2's LSTM training kernels take the
forward direction only ("LSTM and LSTMGrad kernel only supports the forward direction").

A bidirectional LSTM is two forward LSTMs: one over the sequence, one over the sequence reversed
(its outputs reversed back), each with its direction's slice of the weights, biases and initial
states; ``Y`` concatenates them on the direction axis, ``Y_h`` and ``Y_c`` too. The slices are
Gathers of the same trainable parameters, the reversals Gathers with reversed indices (a negative
step Slice's gradient fails in ORT 1.19.2). The rewrite is checked against the node on random data.
"""

from __future__ import annotations

import numpy as np
import onnx

from tasks.prepare.graph import attr, observed_shapes
from tasks.prepare.rewrite_kit import Builder, apply_rewrites, same_values


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _rewrite(model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, list[int]]) -> Builder | None:
    inputs = list(node.input) + [""] * (8 - len(node.input))
    x, w, r, bias, seq_lens, h0, c0, peep = inputs[:8]
    shape = shapes.get(x, [])
    if _text(attr(node, "direction", b"forward")) != "bidirectional" or attr(node, "layout", 0) != 0:
        return None
    if seq_lens or peep or len(shape) != 3 or shape[0] <= 0:
        return None
    acts = [_text(a) for a in attr(node, "activations", [b"Sigmoid", b"Tanh", b"Tanh"] * 2)]
    b = Builder(model, node)
    reverse = b.const("reverse", list(range(shape[0] - 1, -1, -1)), np.int64)
    keep = {k: v for k, v in (("hidden_size", attr(node, "hidden_size", None)), ("clip", attr(node, "clip", None)),
                              ("input_forget", attr(node, "input_forget", None))) if v is not None}  # fmt: skip
    outs: dict[str, list[str]] = {"y": [], "h": [], "c": []}
    for d in (0, 1):
        pick = b.const(f"direction{d}", [d], np.int64)
        args = [b.op("Gather", [t, pick], axis=0) if t else "" for t in (w, r, bias)]
        states = [b.op("Gather", [t, pick], axis=0) if t else "" for t in (h0, c0)]
        seq = x if d == 0 else b.op("Gather", [x, reverse], axis=0)
        names = [f"{b.prefix}/y{d}", f"{b.prefix}/h{d}", f"{b.prefix}/c{d}"]
        own = acts[3 * d : 3 * d + 3]  # the defaults go unsaid: ORT's LSTMGrad reads only those
        extra = {} if [a.lower() for a in own] == ["sigmoid", "tanh", "tanh"] else {"activations": own}
        b.nodes.append(onnx.helper.make_node("LSTM", [seq, *args, "", *states], names, name=f"{b.prefix}/LSTM{d}",
                                             direction="forward", **extra, **keep))  # fmt: skip
        y = names[0] if d == 0 else b.op("Gather", [names[0], reverse], axis=0)
        outs["y"].append(y)
        outs["h"].append(names[1])
        outs["c"].append(names[2])
    wanted = list(node.output) + [""] * (3 - len(node.output))
    for (key, axis), out in zip((("y", 1), ("h", 0), ("c", 0)), wanted, strict=True):
        if out:
            b.op("Concat", outs[key], out, axis=axis)
    return b if same_values(model, node, b, shapes, batch_first=False) else None


def bidirectional_lstms_as_forward(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Rewrite every bidirectional LSTM as two forward ones (ORT's training session refuses one
    anywhere in the graph, on the gradient path or not); return how many."""
    del trainable  # every LSTM of a training graph gets the training kernel
    todo = [i for i, n in enumerate(model.graph.node) if n.op_type == "LSTM"]
    if not todo:
        return 0
    shapes = observed_shapes(model)
    return apply_rewrites(model, todo, lambda node: _rewrite(model, node, shapes))
