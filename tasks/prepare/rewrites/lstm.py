"""Bidirectional LSTMs and GRUs in a training graph: ONNX Runtime 1.19.2's LSTM and GRU training
kernels take the forward direction only ("LSTM and LSTMGrad kernel only supports the forward
direction", "GRUTraining and GRUGrad kernel only supports the forward direction").

A bidirectional LSTM (GRU) is two forward ones: one over the sequence, one over the sequence
reversed (its outputs reversed back), each with its direction's slice of the weights, biases and
initial states; ``Y`` concatenates them on the direction axis, ``Y_h`` and ``Y_c`` too. The slices
are Gathers of the same trainable parameters, the reversals Gathers with reversed indices (a
negative step Slice's gradient fails in ORT 1.19.2). The rewrite is checked against the node on
random data.
"""

from __future__ import annotations

import numpy as np
import onnx

from tasks.prepare.graph import attr
from tasks.prepare.rewrites.rewrite_kit import Builder, rewrite_each, same_values


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# per operator: its activations' defaults (one direction), its state inputs after sequence_lens,
# its outputs, and the attributes a direction keeps
CELLS = {
    "LSTM": (["sigmoid", "tanh", "tanh"], 2, ("y", "h", "c"), ("hidden_size", "clip", "input_forget")),
    "GRU": (["sigmoid", "tanh"], 1, ("y", "h"), ("hidden_size", "clip", "linear_before_reset")),
}


def _rewrite(model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, list[int]]) -> Builder | None:
    defaults, n_states, out_keys, kept = CELLS[node.op_type]
    inputs = list(node.input) + [""] * (8 - len(node.input))
    x, w, r, bias, seq_lens = inputs[:5]
    states_in, peep = inputs[5 : 5 + n_states], inputs[7] if node.op_type == "LSTM" else ""
    shape = shapes.get(x, [])
    if _text(attr(node, "direction", b"forward")) != "bidirectional" or attr(node, "layout", 0) != 0:
        return None
    if seq_lens or peep or len(shape) != 3 or shape[0] <= 0:
        return None
    acts = [_text(a) for a in attr(node, "activations", [d.capitalize().encode() for d in defaults] * 2)]
    b = Builder(model, node)
    reverse = b.const("reverse", list(range(shape[0] - 1, -1, -1)), np.int64)
    keep = {k: v for k in kept if (v := attr(node, k, None)) is not None}
    outs: dict[str, list[str]] = {k: [] for k in out_keys}
    width = len(defaults)
    for d in (0, 1):
        pick = b.const(f"direction{d}", [d], np.int64)
        args = [b.op("Gather", [t, pick], axis=0) if t else "" for t in (w, r, bias)]
        states = [b.op("Gather", [t, pick], axis=0) if t else "" for t in states_in]
        seq = x if d == 0 else b.op("Gather", [x, reverse], axis=0)
        names = [f"{b.prefix}/{k}{d}" for k in out_keys]
        own = acts[width * d : width * (d + 1)]  # the defaults go unsaid: ORT's gradients read only those
        extra = {} if [a.lower() for a in own] == defaults else {"activations": own}
        b.nodes.append(onnx.helper.make_node(node.op_type, [seq, *args, "", *states], names,
                                             name=f"{b.prefix}/{node.op_type}{d}", direction="forward",
                                             **extra, **keep))  # fmt: skip
        y = names[0] if d == 0 else b.op("Gather", [names[0], reverse], axis=0)
        outs["y"].append(y)
        for key, name in zip(out_keys[1:], names[1:], strict=True):
            outs[key].append(name)
    wanted = list(node.output) + [""] * (len(out_keys) - len(node.output))
    for key, out in zip(out_keys, wanted, strict=True):
        if out:
            b.op("Concat", outs[key], out, axis=1 if key == "y" else 0)
    return b if same_values(model, node, b, shapes, batch_first=False) else None


def bidirectional_lstms_as_forward(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Rewrite every bidirectional LSTM and GRU as two forward ones (ORT's training session refuses
    one anywhere in the graph, on the gradient path or not); return how many."""
    del trainable  # every LSTM and GRU of a training graph gets the training kernel
    return rewrite_each(model, set(CELLS), _rewrite)
