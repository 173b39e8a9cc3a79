"""Recurrent layers (``nn.RNN``, ``nn.GRU``, ``nn.LSTM``) in a traced step, as one operator per
layer and direction whose size does not depend on the sequence length.

``torch.export`` decomposes a recurrent layer into its steps: a graph that grows with the length
(a GRU over 128 steps: thousands of nodes forward and as many backward), slow to trace and export
and, on the board, one buffer per step. Here each layer and direction is instead one operator,
``odl_rnn::layer`` (forward: the layer's output sequence and last cell state) with its backward
``odl_rnn::layer_backward``; :mod:`.recurrent_onnx` writes the first as ONNX's own RNN/GRU/LSTM node
and the second as batched products around one ``Scan`` over time. In PyTorch they run as
PyTorch's own kernels (the forward) and as the same formulas as the ONNX graph (the backward),
which :func:`check_backward` compares, on each configuration a model uses, with PyTorch's autograd
of its own recurrent kernel.

:func:`layer_ops` puts the operators in the modules' place while ``torch.export`` traces a model;
:func:`differentiable` makes the traced graph's operators differentiable for ``make_fx`` over
``torch.func.grad_and_value``. A module this does not cover (an LSTM with ``proj_size``, a packed
sequence, an unbatched input, another dtype than float32) keeps PyTorch's own decomposition.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

from tasks.errors import ArtifactError
from tasks.prepare.runtimes.autograd import op_checks

MODES = {"RNN_TANH": 1, "RNN_RELU": 1, "GRU": 3, "LSTM": 4}  # gates per mode
RTOL = 1e-4  # of the largest |value| of PyTorch's gradient (float32 sums in another order)


def mode_of(module: Any) -> str | None:
    """The operator mode of a recurrent module this covers, or None."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if not isinstance(module, torch.nn.RNNBase):
        return None
    if any(p.dtype != torch.float32 for p in module.parameters()):
        return None
    return module.mode if module.mode in MODES else None


@functools.cache
def ops() -> types.SimpleNamespace:
    """The two operators (defined once per process) and their autograd wrapper."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    schema = ("(Tensor x, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, Tensor b_ih, Tensor b_hh, Tensor w_hr, "
              "str mode) -> (Tensor, Tensor)")  # fmt: skip

    @torch.library.custom_op("odl_rnn::layer", mutates_args=(), schema=schema)
    def layer(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode):  # noqa: ANN001, ANN202 - the schema types it
        return forward_kernel(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode)

    @layer.register_fake
    def _(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode):  # noqa: ANN001, ANN202 - torch's fake-kernel signature
        return x.new_empty(x.shape[0], x.shape[1], w_hh.shape[1]), c0.new_empty(c0.shape)

    lib = torch.library.Library("odl_rnn", "FRAGMENT")  # no autograd of its own: a backward only
    lib.define("layer_backward(Tensor gy, Tensor gc, Tensor x, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, "
               "Tensor b_ih, Tensor b_hh, Tensor w_hr, Tensor y, str mode) -> Tensor[]")  # fmt: skip
    lib.impl("layer_backward", backward_math, "CompositeExplicitAutograd")

    @torch.library.register_fake("odl_rnn::layer_backward", lib=lib)
    def _(gy, gc, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, y, mode):  # noqa: ANN001, ANN202
        return [
            t.new_empty(t.shape) for t in (x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
        ]  # contiguous, as computed

    class Layer(torch.autograd.Function):
        @staticmethod
        def forward(*args: Any) -> Any:
            with torch._C._AutoDispatchBelowAutograd():
                return torch.ops.odl_rnn.layer(*args)

        @staticmethod
        def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
            ctx.mode = inputs[-1]
            ctx.save_for_backward(*inputs[:-1], output[0])

        @staticmethod
        def backward(ctx: Any, gy: Any, gc: Any) -> Any:
            saved = ctx.saved_tensors
            gy = torch.zeros_like(saved[-1]) if gy is None else gy
            gc = torch.zeros_like(saved[2]) if gc is None else gc
            _record(gy, gc, saved, ctx.mode)
            with torch._C._AutoDispatchBelowAutograd():
                grads = torch.ops.odl_rnn.layer_backward(gy, gc, *saved, ctx.mode)
            return (*grads, None)

    def differentiable_layer(*args: Any) -> Any:
        return Layer.apply(*args)

    return types.SimpleNamespace(layer=torch.ops.odl_rnn.layer.default, lib=lib,
                                 backward=torch.ops.odl_rnn.layer_backward.default, apply=differentiable_layer)  # fmt: skip


def forward_kernel(x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, w_hr: Any,
                   mode: str) -> Any:  # fmt: skip
    """One layer and direction with PyTorch's own kernel: ``x`` [T, B, I], states [B, H] (an LSTM
    with a projection ``w_hr`` [P, H], empty without: ``h0`` [B, P]) -> (the output sequence
    [T, B, H or P], the last cell state [B, H]; ``c0`` itself but for an LSTM)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    weights = [w_ih, w_hh, b_ih, b_hh, *([w_hr] if w_hr.numel() else [])]
    if mode == "LSTM":
        y, _, c = torch._VF.lstm(x, (h0[None], c0[None]), weights, True, 1, 0.0, False, False, False)
        return y.contiguous(), c[0].contiguous()
    kernel = {"GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh, "RNN_RELU": torch._VF.rnn_relu}[mode]
    y, _ = kernel(x, h0[None], weights, True, 1, 0.0, False, False, False)
    return y.contiguous(), c0.clone()


def backward_math(gy: Any, gc: Any, x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any,
                  w_hr: Any, y: Any, mode: str) -> list[Any]:  # fmt: skip
    """The gradients of (x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr) given those of the output sequence (``gy``)
    and of the last cell state (``gc``; but for an LSTM that output is ``c0`` itself): the formulas
    :mod:`.recurrent_onnx` writes, step by step."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    hprev = torch.cat([h0[None], y[:-1]], 0)
    pre_x, pre_h = x @ w_ih.T + b_ih, hprev @ w_hh.T + b_hh
    per_step = _gates(mode, pre_x, pre_h, c0, y)
    dh, dc, dgx, dgh, dw_hr = torch.zeros_like(h0), gc, [], [], torch.zeros_like(w_hr)
    for t in range(y.shape[0] - 1, -1, -1):
        d = gy[t] + dh
        if w_hr.numel():  # h = m W_hr^T with m = o tanh(c): through the projection first
            dw_hr = dw_hr + d.T @ (per_step[3][t] * per_step[4][t])
            d = d @ w_hr
        gates_x, gates_h, dh_prev, dc = _step_back(mode, d, dc, [s[t] for s in per_step], hprev[t])
        dh = dh_prev + gates_h @ w_hh
        dgx.append(gates_x)
        dgh.append(gates_h)
    gx, gh = torch.stack(dgx[::-1]), torch.stack(dgh[::-1])
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    grads = [
        gx @ w_ih,
        dh,
        dc,
        flat(gx).T @ flat(x),
        flat(gh).T @ flat(hprev),
        gx.sum((0, 1)),
        gh.sum((0, 1)),
        dw_hr,
    ]
    return [g.contiguous() for g in grads]


def _gates(mode: str, pre_x: Any, pre_h: Any, c0: Any, y: Any) -> list[Any]:
    """What each step's backward reads, for all steps at once (LSTM: the cell states by a scan)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if mode == "GRU":
        xr, xz, xn = pre_x.chunk(3, -1)
        hr, hz, hn = pre_h.chunk(3, -1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        return [r, z, torch.tanh(xn + r * hn), hn]
    if mode == "LSTM":
        i, f, g, o = (pre_x + pre_h).chunk(4, -1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        cells, c = [], c0
        for t in range(y.shape[0]):
            c = f[t] * c + i[t] * g[t]
            cells.append(c)
        c = torch.stack(cells)
        return [i, f, g, o, torch.tanh(c), torch.cat([c0[None], c[:-1]], 0)]
    slope = (1 - y * y) if mode == "RNN_TANH" else (y > 0).to(y.dtype)
    return [slope]


def _step_back(mode: str, d: Any, dc: Any, s: list[Any], hprev: Any) -> tuple[Any, Any, Any, Any]:  # noqa: C901
    """One step back: (pre-activation gradients of the input and recurrent products, the direct
    part of the previous state's gradient, the previous cell state's gradient)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if mode == "GRU":
        r, z, n, hn = s
        dn = d * (1 - z) * (1 - n * n)
        dz = d * (hprev - n) * z * (1 - z)
        dr = dn * hn * r * (1 - r)
        return torch.cat([dr, dz, dn], -1), torch.cat([dr, dz, dn * r], -1), d * z, dc
    if mode == "LSTM":
        i, f, g, o, tc, cprev = s
        dct = dc + d * o * (1 - tc * tc)
        gates = torch.cat([dct * g * i * (1 - i), dct * cprev * f * (1 - f), dct * i * (1 - g * g),
                           d * tc * o * (1 - o)], -1)  # fmt: skip
        return gates, gates, 0.0, dct * f  # the state reaches the gates through W_hh only
    dp = d * s[0]
    return dp, dp, 0.0, dc


# --- the modules' forward as the operators -------------------------------------------------------


def _forward(module: Any, input: Any, hx: Any = None) -> Any:  # noqa: A002 - nn.RNNBase's own names
    """``module``'s forward (nn.RNN/GRU/LSTM semantics, batched input) over ``odl_rnn::layer``."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    layer, mode = ops().layer, module.mode
    x = input.transpose(0, 1) if module.batch_first else input
    dirs, hidden, proj = 2 if module.bidirectional else 1, module.hidden_size, getattr(module, "proj_size", 0)
    h_in, c_in = (hx if mode == "LSTM" else (hx, None)) if hx is not None else (None, None)
    zeros = x.new_zeros(x.shape[1], hidden)
    h_out, c_out = [], []
    for k in range(module.num_layers):
        ys = []
        for d in range(dirs):
            i, suffix = k * dirs + d, f"_l{k}" + ("_reverse" if d else "")
            w_ih, w_hh = getattr(module, f"weight_ih{suffix}"), getattr(module, f"weight_hh{suffix}")
            b_ih = getattr(module, f"bias_ih{suffix}") if module.bias else w_ih.new_zeros(w_ih.shape[0])
            b_hh = getattr(module, f"bias_hh{suffix}") if module.bias else w_hh.new_zeros(w_hh.shape[0])
            w_hr = getattr(module, f"weight_hr{suffix}") if proj else w_hh.new_zeros(0)
            h0 = x.new_zeros(x.shape[1], proj or hidden) if h_in is None else h_in[i]
            c0 = zeros if c_in is None else c_in[i]
            y, c = layer(x.flip(0) if d else x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode)
            h_out.append(y[-1])
            c_out.append(c)
            ys.append(y.flip(0) if d else y)
        x = torch.cat(ys, -1) if dirs > 1 else ys[0]
        if module.dropout and module.training and k < module.num_layers - 1:
            x = torch.nn.functional.dropout(x, module.dropout, training=True)
    out = x.transpose(0, 1) if module.batch_first else x
    h_n = torch.stack(h_out)
    return (out, (h_n, torch.stack(c_out))) if mode == "LSTM" else (out, h_n)


def covered(module: Any) -> bool:
    """Whether ``module`` traces as ``odl_rnn::layer`` operators (:func:`layer_ops`)."""
    return mode_of(module) is not None


@contextlib.contextmanager
def layer_ops(model: Any) -> Iterator[list[str]]:
    """Within the block, each covered recurrent module of ``model`` runs over ``odl_rnn::layer``
    (a packed or unbatched input: its own forward); yields their names."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    swapped = []
    for name, module in model.named_modules():
        if covered(module):
            own = module.forward

            def forward(input: Any, hx: Any = None, _m: Any = module, _own: Any = own) -> Any:  # noqa: A002
                if isinstance(input, torch.nn.utils.rnn.PackedSequence) or input.dim() != 3:
                    return _own(input, hx)
                return _forward(_m, input, hx)

            module.forward = forward
            swapped.append((name, module))
    try:
        yield [n for n, _ in swapped]
    finally:
        for _, module in swapped:
            del module.forward  # the class's own again


def differentiable(gm: Any) -> Any:
    """``gm`` (a traced forward) with its ``odl_rnn::layer`` nodes calling the autograd wrapper."""
    found = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is ops().layer:
            node.target, found = ops().apply, True
    if found:
        gm.recompile()
    return gm


# --- checks against PyTorch's autograd ------------------------------------------------------------


def _record(gy: Any, gc: Any, saved: tuple[Any, ...], mode: str) -> None:
    """Record the backward's configuration for :func:`check_backward` (shapes and mode)."""
    x, h0, c0, w_ih, w_hr = saved[0], saved[1], saved[2], saved[3], saved[7]
    op_checks.record_use(ops().backward, (x, h0, c0, w_ih, w_hr, mode), check_backward)


def check_backward(use: Any, seed: int = 0) -> float:
    """Our backward of one recorded layer configuration against PyTorch's autograd of its own
    recurrent kernel, on random data; the largest difference relative to PyTorch's largest value
    (ArtifactError beyond :data:`RTOL`)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    x_arg, h_arg, c_arg, _, p_arg, mode = use.args
    (steps, batch, features), out, gates = x_arg.shape, h_arg.shape[-1], MODES[mode]
    hidden = c_arg.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen) * 0.5  # noqa: E731
    leaves = [rand(steps, batch, features), rand(batch, out), rand(batch, hidden), rand(gates * hidden, features),
              rand(gates * hidden, out), rand(gates * hidden), rand(gates * hidden), rand(*p_arg.shape)]  # fmt: skip
    leaves = [t.requires_grad_() for t in leaves]
    y, c = forward_kernel(*leaves, mode)
    gy, gc = rand(*y.shape), rand(*c.shape)
    want = torch.autograd.grad([y, c], leaves, [gy, gc], allow_unused=True)
    got = backward_math(gy, gc, *[t.detach() for t in leaves], y.detach(), mode)
    worst = 0.0
    for w, g in zip(want, got, strict=True):
        w = torch.zeros_like(g) if w is None else w
        if not g.numel():  # no projection: its empty weight
            continue
        worst = max(worst, float((g - w).abs().max()) / max(1.0, float(w.abs().max())))
    if not worst <= RTOL:
        raise ArtifactError(f"the backward of {use.describe()} differs from PyTorch's autograd by {worst:.3g} "
                            f"(relative; at most {RTOL} expected): this recurrent layer cannot train with "
                            "training.runtime = 'autograd' yet")  # fmt: skip
    return worst
