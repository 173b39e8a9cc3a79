"""The recurrent operators of :mod:`.recurrent` in ONNX: a layer's forward as ONNX's own RNN, GRU or
LSTM node, its backward as batched products around one ``Scan`` over time.

The exporter writes each operator as a node of the domain :data:`DOMAIN` (:func:`translations`:
schemas registered with ``onnx.defs`` so onnxscript's tracer takes them); :func:`expand` then
replaces each such node of the saved step by plain operators, whose number does not depend on the
sequence length:

* forward: the gates reordered from PyTorch's (GRU r, z, n; LSTM i, f, g, o) to ONNX's (z, r, h;
  i, o, f, c), one RNN/GRU/LSTM node (GRU with ``linear_before_reset``, as PyTorch computes it);
* backward: the input and recurrent products of every step at once (two MatMuls over the whole
  sequence, the previous states being the output shifted by one step), the gates from them, an
  LSTM's cell states by a forward ``Scan`` of element-wise operators; then one reverse ``Scan``
  carrying the state gradients (its body: element-wise operators and one [B, G·H] x [G·H, H]
  product); then the weight gradients as one product each over all steps.

The body reads the recurrent weight from the outer graph. What the board holds for the backward
is the output sequence and the per-step gates: a few [T, B, G·H] tensors, no per-step copies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import onnx
from onnx import TensorProto, helper
from onnx.defs import OpSchema

from tasks.prepare.runtimes.autograd.recurrent import ops
from tasks.prepare.runtimes.autograd.recurrent_graph import Graph, scan

DOMAIN = "odl.rnn"
FORWARD, BACKWARD = "Layer", "LayerBackward"
ONNX_ORDER = {"GRU": [1, 0, 2], "LSTM": [0, 3, 1, 2]}  # PyTorch's gate k at ONNX's position


@functools.cache
def _schemas() -> None:
    """Register the two placeholder operators with ``onnx.defs`` (once per process)."""

    def schema(name: str, inputs: int, outputs: int) -> OpSchema:
        return OpSchema(name, DOMAIN, 1, inputs=[OpSchema.FormalParameter(f"in{k}", "T") for k in range(inputs)],
                        outputs=[OpSchema.FormalParameter(f"out{k}", "T") for k in range(outputs)],
                        type_constraints=[("T", ["tensor(float)"], "float32 tensors")],
                        attributes=[OpSchema.Attribute("mode", OpSchema.AttrType.STRING, "RNN_TANH ... LSTM"),
                                    OpSchema.Attribute("hidden_size", OpSchema.AttrType.INT, "H"),
                                    OpSchema.Attribute("projected", OpSchema.AttrType.INT, "an LSTM's w_hr")])  # fmt: skip

    onnx.defs.register_schema(schema(FORWARD, 8, 2))
    onnx.defs.register_schema(schema(BACKWARD, 11, 8))


def translations() -> dict[Any, Callable[..., Any]]:
    """The exporter's ``custom_translation_table`` entries for :mod:`.recurrent`'s operators."""
    import onnxscript  # the exporter's tracer

    _schemas()
    opset = onnxscript.values.Opset(DOMAIN, 1)

    def forward(
        x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, w_hr: Any, mode: str
    ) -> Any:
        hidden = int(w_ih.shape[0]) // {"RNN_TANH": 1, "RNN_RELU": 1, "GRU": 3, "LSTM": 4}[mode]
        projected = int(len(w_hr.shape) == 2)
        return getattr(opset, FORWARD)(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode=mode, hidden_size=hidden,
                                       projected=projected, _outputs=2)  # fmt: skip

    def backward(gy: Any, gc: Any, x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, w_hr: Any,
                 y: Any, mode: str) -> Any:  # fmt: skip
        hidden = int(w_ih.shape[0]) // {"RNN_TANH": 1, "RNN_RELU": 1, "GRU": 3, "LSTM": 4}[mode]
        projected = int(len(w_hr.shape) == 2)
        return getattr(opset, BACKWARD)(gy, gc, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, y, mode=mode,
                                        hidden_size=hidden, projected=projected, _outputs=8)  # fmt: skip

    return {ops().layer: forward, ops().backward: backward}


def _onnx_gates(g: Graph, w: str, mode: str, axis: int) -> str:
    """``w`` with its gate blocks (along ``axis``) in ONNX's order."""
    if mode not in ONNX_ORDER:
        return w
    parts = g.split(w, len(ONNX_ORDER[mode]), axis)
    return g.concat([parts[k] for k in ONNX_ORDER[mode]], axis)


def _forward(g: Graph, node: onnx.NodeProto, mode: str) -> None:
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = node.input
    if _attr(node, "projected"):  # ONNX's LSTM has no projection: a Scan over time
        pre_x = g.op("Add", [g.op("MatMul", [x, g.op("Transpose", [w_ih])]), b_ih])
        _, c, y = scan(
            g, [h0, c0], [pre_x], False, 1, lambda b, st, sl: _projected_cell(b, st, sl, (w_hh, b_hh), w_hr)
        )
        g.nodes.append(helper.make_node("Identity", [y], [node.output[0]], name=g.name("Identity")))
        g.nodes.append(helper.make_node("Identity", [c], [node.output[1]], name=g.name("Identity")))
        return
    zero = g.ints([0])
    weights = [g.op("Unsqueeze", [_onnx_gates(g, w, mode, 0), zero]) for w in (w_ih, w_hh)]
    bias = g.op("Unsqueeze", [g.concat([_onnx_gates(g, b, mode, 0) for b in (b_ih, b_hh)], 0), zero])
    states = [g.op("Unsqueeze", [h0, zero])] + ([g.op("Unsqueeze", [c0, zero])] if mode == "LSTM" else [])
    hidden = {"hidden_size": _attr(node, "hidden_size")}
    if mode == "LSTM":
        y, _, c = g.op("LSTM", [x, *weights, bias, "", *states], 3, **hidden)
        g.nodes.append(helper.make_node("Squeeze", [c, zero], [node.output[1]], name=g.name("Squeeze")))
    else:
        op_type = "GRU" if mode == "GRU" else "RNN"
        attrs = (
            {"linear_before_reset": 1}
            if mode == "GRU"
            else {"activations": ["Tanh" if mode == "RNN_TANH" else "Relu"]}
        )
        y = g.op(op_type, [x, *weights, bias, "", *states], 2, **hidden, **attrs)[0]
        g.nodes.append(helper.make_node("Identity", [c0], [node.output[1]], name=g.name("Identity")))
    g.nodes.append(helper.make_node("Squeeze", [y, g.ints([1])], [node.output[0]], name=g.name("Squeeze")))


def _attr(node: onnx.NodeProto, name: str) -> int:
    return next((a.i for a in node.attribute if a.name == name), 0)


def _projected_cell(b: Graph, st: list[str], sl: list[str], weights: tuple[str, str], w_hr: str) -> tuple[list[str], list[str]]:  # fmt: skip
    """One step of an LSTM with a projection: (h, c) from the previous ones and the step's input product."""
    i, f, g, o = b.split(b.op("Add", [sl[0], _pre_h(b, st[0], weights)]), 4, -1)
    i, f, g, o = b.op("Sigmoid", [i]), b.op("Sigmoid", [f]), b.op("Tanh", [g]), b.op("Sigmoid", [o])
    c = b.op("Add", [b.mul(f, st[1]), b.mul(i, g)])
    h = b.op("Gemm", [b.mul(o, b.op("Tanh", [c])), w_hr], transB=1)
    return [h, c], [h]


def backward_nodes(g: Graph, node: onnx.NodeProto, mode: str) -> None:  # noqa: C901
    """``g``'s nodes for a backward placeholder ``node`` (inputs: the output sequence's and final
    cell's gradients, x, h0, c0, the weights and biases in PyTorch's layout, the projection and the
    output sequence; outputs: the gradients of x, h0, c0 and each weight, written to its outputs)."""
    gy, gc, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, y = node.input
    projected = w_hr if _attr(node, "projected") else None
    zero, minus_one = g.ints([0]), g.ints([-1])
    hprev = g.concat([g.op("Unsqueeze", [h0, zero]), g.op("Slice", [y, zero, minus_one, zero])], 0)
    zeros = [g.op("ConstantOfShape", [g.op("Shape", [t])], value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]))
             for t in (h0, w_hh, b_hh)]  # fmt: skip
    weights = (w_hh, b_hh)
    if mode == "RNN_TANH" or mode == "RNN_RELU":
        slope = (
            g.tanh_slope(y)
            if mode == "RNN_TANH"
            else g.op("Cast", [g.op("Greater", [y, g.scalar(0.0)])], to=TensorProto.FLOAT)
        )
        dh, dw_hh, db_hh, gx = scan(
            g, zeros, [gy, slope, hprev], True, 1, lambda b, st, sl: _rnn_step(b, st, sl, weights)
        )
        dc, dw_hr = gc, []
    else:
        pre_x = g.op("Add", [g.op("MatMul", [x, g.op("Transpose", [w_ih])]), b_ih])
        if mode == "GRU":
            dh, dw_hh, db_hh, gx = scan(
                g, zeros, [gy, pre_x, hprev], True, 1, lambda b, st, sl: _gru_step(b, st, sl, weights)
            )
            dc, dw_hr = gc, []
        else:  # the cell states by a forward scan first
            cells = scan(g, [c0], [pre_x, hprev], False, 1, lambda b, st, sl: _lstm_cell(b, st, sl, weights))[
                1
            ]
            cprev = g.concat(
                [g.op("Unsqueeze", [c0, zero]), g.op("Slice", [cells, zero, minus_one, zero])], 0
            )
            extra = [g.op("ConstantOfShape", [g.op("Shape", [w_hr])])] if projected else []
            dh, dc, dw_hh, db_hh, *dw_hr, gx = scan(g, [zeros[0], gc, *zeros[1:], *extra], [gy, pre_x, hprev, cells, cprev],
                                                     True, 1, lambda b, st, sl: _lstm_step(b, st, sl, weights, projected))  # fmt: skip
    grads = [
        g.op("MatMul", [gx, w_ih]),
        dh,
        dc,  # but for an LSTM, the cell state output is c0 itself
        g.op("Gemm", [g.op("Flatten", [gx], axis=2), g.op("Flatten", [x], axis=2)], transA=1),
        dw_hh,
        g.op("ReduceSum", [gx, g.ints([0, 1])], keepdims=0),
        db_hh,
        dw_hr[0] if dw_hr else w_hr,  # without a projection, an empty tensor's (empty) gradient
    ]
    for value, out in zip(grads, node.output, strict=True):
        g.nodes.append(helper.make_node("Identity", [value], [out], name=g.name("Identity")))


def _recurrent_grads(b: Graph, st: list[str], gates: str, hprev: str, w_hh: str) -> list[str]:
    """A step's updates of the carried gradients of the recurrent weight and bias, and the
    previous state's gradient through the recurrent product."""
    return [b.op("MatMul", [gates, w_hh]), b.op("Add", [st[0], b.op("Gemm", [gates, hprev], transA=1)]),
            b.op("Add", [st[1], b.op("ReduceSum", [gates, b.ints([0])], keepdims=0)])]  # fmt: skip


def _pre_h(b: Graph, hprev: str, weights: tuple[str, str]) -> str:
    return b.op("Gemm", [hprev, *weights], transB=1)


def _gru_step(
    b: Graph, st: list[str], sl: list[str], weights: tuple[str, str]
) -> tuple[list[str], list[str]]:
    gy, pre_x, hprev = sl
    xr, xz, xn = b.split(pre_x, 3, -1)
    hr, hz, hn = b.split(_pre_h(b, hprev, weights), 3, -1)
    r, z = b.op("Sigmoid", [b.op("Add", [xr, hr])]), b.op("Sigmoid", [b.op("Add", [xz, hz])])
    n = b.op("Tanh", [b.op("Add", [xn, b.mul(r, hn)])])
    d = b.op("Add", [gy, st[0]])
    dn = b.mul(d, b.one_minus(z), b.tanh_slope(n))
    dz = b.mul(d, b.op("Sub", [hprev, n]), b.sigmoid_slope(z))
    dr = b.mul(dn, hn, b.sigmoid_slope(r))
    gx, gh = b.concat([dr, dz, dn], -1), b.concat([dr, dz, b.mul(dn, r)], -1)
    through, dw, db = _recurrent_grads(b, st[1:], gh, hprev, weights[0])
    return [b.op("Add", [b.mul(d, z), through]), dw, db], [gx]


def _lstm_gates(b: Graph, pre_x: str, hprev: str, weights: tuple[str, str]) -> list[str]:
    i, f, g, o = b.split(b.op("Add", [pre_x, _pre_h(b, hprev, weights)]), 4, -1)
    return [b.op("Sigmoid", [i]), b.op("Sigmoid", [f]), b.op("Tanh", [g]), b.op("Sigmoid", [o])]


def _lstm_cell(
    b: Graph, st: list[str], sl: list[str], weights: tuple[str, str]
) -> tuple[list[str], list[str]]:
    i, f, g, _ = _lstm_gates(b, sl[0], sl[1], weights)
    c = b.op("Add", [b.mul(f, st[0]), b.mul(i, g)])
    return [c], [c]


def _lstm_step(
    b: Graph, st: list[str], sl: list[str], weights: tuple[str, str], w_hr: str | None = None
) -> tuple[list[str], list[str]]:
    gy, pre_x, hprev, c, cprev = sl
    i, f, gg, o = _lstm_gates(b, pre_x, hprev, weights)
    tc = b.op("Tanh", [c])
    d = b.op("Add", [gy, st[0]])
    projection = []
    if w_hr is not None:  # h = m W_hr^T with m = o tanh(c): through the projection first
        projection = [b.op("Add", [st[4], b.op("Gemm", [d, b.mul(o, tc)], transA=1)])]
        d = b.op("MatMul", [d, w_hr])
    dct = b.op("Add", [st[1], b.mul(d, o, b.tanh_slope(tc))])
    gates = b.concat([b.mul(dct, gg, b.sigmoid_slope(i)), b.mul(dct, cprev, b.sigmoid_slope(f)),
                      b.mul(dct, i, b.tanh_slope(gg)), b.mul(d, tc, b.sigmoid_slope(o))], -1)  # fmt: skip
    through, dw, db = _recurrent_grads(b, st[2:4], gates, hprev, weights[0])
    return [through, b.mul(dct, f), dw, db, *projection], [gates]


def _rnn_step(
    b: Graph, st: list[str], sl: list[str], weights: tuple[str, str]
) -> tuple[list[str], list[str]]:
    gy, slope, hprev = sl
    dp = b.mul(b.op("Add", [gy, st[0]]), slope)
    return _recurrent_grads(b, st[1:], dp, hprev, weights[0]), [dp]


def expand(model: onnx.ModelProto) -> int:
    """Replace every placeholder node of :data:`DOMAIN` in ``model`` (in place) by its ONNX
    operators; the number replaced."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 18)
    nodes, count = [], 0
    for node in model.graph.node:
        if node.domain != DOMAIN:
            nodes.append(node)
            continue
        mode = next(a.s.decode() for a in node.attribute if a.name == "mode")
        g = Graph(node.name or node.output[0], opset)
        (_forward if node.op_type == FORWARD else backward_nodes)(g, node, mode)
        nodes.extend(g.nodes)
        count += 1
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        kept = [o for o in model.opset_import if o.domain != DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return count
