"""Every dropout of a model as ``torch.nn.functional.dropout``, which the TorchScript exporter writes
as one ``Dropout`` node in training mode (:mod:`.graph_lowering` draws its mask from a noise input).

Two kinds of dropout have no training-mode export of their own: a channel dropout
(``dropout1d/2d/3d``) becomes a plain dropout of a ones tensor of one element per sample and
channel, times the input (as PyTorch draws it: one mask value per channel); a stacked recurrent
layer's dropout between its layers becomes its layers run one by one (``torch._VF``'s own
single-layer kernels, with the layer's own parameters), a plain dropout on each output but the
last, as PyTorch applies it. An attention's dropout inside ``scaled_dot_product_attention`` (its
kernel draws it, not ``dropout``; the exporter writes it as a Dropout all the same) becomes the
attention written out: scores, mask, softmax, a plain dropout of the weights, times the values.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def dropout_nodes(model: Any, batch: Any = None) -> Iterator[None]:
    """Within the block, ``model``'s channel dropouts and stacked recurrent layers' dropouts are
    plain dropouts (in the export as in PyTorch's own run); with ``batch`` (the step's first input),
    so is a per-sample ``bernoulli_`` (stochastic depth: ``x.new_empty((n, 1, 1)).bernoulli_(keep)``):
    a dropout of ones, and a ``new_empty`` of ``x``'s rows takes its row count from ``x`` (the trace
    would fix it at the example batch)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    f = torch.nn.functional
    saved = {
        n: getattr(f, n) for n in ("dropout1d", "dropout2d", "dropout3d", "scaled_dot_product_attention")
    }

    def channel(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if not training or p == 0.0:
            return x
        ones = torch.ones_like(x[(slice(None), slice(None), *([slice(0, 1)] * (x.dim() - 2)))])
        return x * f.dropout(ones, p, True)

    # (a single layer's dropout drops nothing in PyTorch, and its export refuses it alike)
    stacked = [m for m in model.modules() if isinstance(m, torch.nn.RNNBase) and m.dropout > 0
               and m.training and not getattr(m, "proj_size", 0)]  # fmt: skip

    def attention(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
                  scale: Any = None, enable_gqa: bool = False) -> Any:  # fmt: skip
        if dropout_p == 0.0:
            return saved["scaled_dot_product_attention"](
                q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        return _attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    bernoulli, new_empty = torch.Tensor.bernoulli_, torch.Tensor.new_empty

    def sized(self: Any, size: Any, *args: Any, **kwargs: Any) -> Any:
        size = list(size[0] if len(size) == 1 and not isinstance(size[0], int) else size)
        if (
            batch is None
            or args
            or kwargs
            or not size
            or not self.dim()
            or not len(self) == size[0] == len(batch)
        ):
            return new_empty(self, size, *args, **kwargs)
        rows = torch.zeros_like(
            (self.flatten(1) if self.dim() > 1 else self[:, None])[:, :1]
        )  # [n, 1], n traced
        return rows.reshape(-1, *([1] * (len(size) - 1))).expand(-1, *size[1:]).contiguous()

    def per_sample(self: Any, p: Any = 0.5, *args: Any, **kwargs: Any) -> Any:
        if (
            batch is None
            or not isinstance(p, float)
            or args
            or kwargs
            or not self.dim()
            or len(self) != len(batch)
        ):
            return bernoulli(self, p, *args, **kwargs)
        ones = torch.ones_like(self)
        mask = f.dropout(ones, 1.0 - p, True) * p if 0.0 < p < 1.0 else ones * float(p >= 1.0)
        return self.copy_(mask)

    torch.Tensor.new_empty = sized
    torch.Tensor.bernoulli_ = per_sample
    for name in saved:
        setattr(f, name, channel if name.startswith("dropout") else attention)
    for m in stacked:
        m.forward = types.MethodType(_layer_by_layer, m)
    try:
        yield
    finally:
        torch.Tensor.bernoulli_, torch.Tensor.new_empty = bernoulli, new_empty
        for name, fn in saved.items():
            setattr(f, name, fn)
        for m in stacked:
            del m.forward


def _layer_by_layer(self: Any, input: Any, hx: Any = None) -> Any:  # noqa: A002 - nn.RNNBase's own names
    """``nn.RNNBase.forward`` of a stacked layer with dropout, one layer at a time."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if not isinstance(input, torch.Tensor) or input.dim() != 3:
        raise TypeError("a stacked recurrent layer's input here is a batched 3-D tensor")
    dirs, lstm = 1 + self.bidirectional, self.mode == "LSTM"
    batch = input.shape[0 if self.batch_first else 1]
    if hx is None:
        zeros = input.new_zeros(self.num_layers * dirs, batch, self.hidden_size)
        hx = (zeros, zeros) if lstm else zeros
    kernel = {"LSTM": torch._VF.lstm, "GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh,
              "RNN_RELU": torch._VF.rnn_relu}[self.mode]  # fmt: skip
    per = 4 if self.bias else 2
    out, hs, cs = input, [], []
    for layer in range(self.num_layers):
        weights = self._flat_weights[layer * dirs * per : (layer + 1) * dirs * per]
        part = slice(layer * dirs, (layer + 1) * dirs)
        state = (hx[0][part], hx[1][part]) if lstm else hx[part]
        result = kernel(
            out, state, weights, self.bias, 1, 0.0, self.training, self.bidirectional, self.batch_first
        )
        out, h = result[0], result[1]
        hs.append(h)
        if lstm:
            cs.append(result[2])
        if layer < self.num_layers - 1:
            out = torch.nn.functional.dropout(out, self.dropout, self.training)
    h = torch.cat(hs, 0)
    return (out, (h, torch.cat(cs, 0))) if lstm else (out, h)


def _attention(q: Any, k: Any, v: Any, mask: Any, p: float, causal: bool, scale: Any, gqa: bool) -> Any:
    """``scaled_dot_product_attention`` as its documentation writes it, the weights' dropout a plain
    ``dropout``."""
    import math

    import torch  # torch (heavy) only when a PyTorch model is built or run

    if gqa:
        k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.size(-1)) if scale is None else scale)
    if causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.nn.functional.dropout(torch.softmax(scores, dim=-1), p, True)
    return weights @ v
