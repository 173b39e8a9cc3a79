"""Recurrent layers (``nn.RNN``, ``nn.GRU``, ``nn.LSTM``) in a traced step, as one operator per
layer and direction whose size does not depend on the sequence length.

``torch.export`` decomposes a recurrent layer into its steps: a graph that grows with the length
(a GRU over 128 steps: thousands of nodes forward and as many backward), slow to trace and export
and, on the board, one buffer per step. Here each layer and direction is instead one operator,
``odl_rnn::layer`` (forward: the layer's output sequence and last cell state) with its backward
``odl_rnn::layer_backward``; :mod:`.recurrent_onnx` writes the first as ONNX's own RNN/GRU/LSTM node
and the second as batched products around one ``Scan`` over time. In PyTorch they run as
PyTorch's own kernels (the forward) and as the same formulas as the ONNX graph (the backward),
which :func:`.recurrent_math.check_backward` compares, on each configuration a model uses, with PyTorch's autograd
of its own recurrent kernel.

:func:`layer_ops` puts the operators in the modules' place while ``torch.export`` traces a model;
:func:`differentiable` makes the traced graph's operators differentiable for ``make_fx`` over
``torch.func.grad_and_value``. A module this does not cover (another dtype than float32) or a call
it does not (a packed sequence, an unbatched input) keeps PyTorch's own decomposition. The
operators' arithmetic and its check are :mod:`.recurrent_math`'s.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

from tasks.prepare.runtimes.autograd import op_checks
from tasks.prepare.runtimes.autograd.recurrent_math import (
    MODES,
    backward_math,
    check_backward,
    forward_kernel,
)


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
