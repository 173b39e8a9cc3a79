"""Backward decompositions chosen for ONNX Runtime's speed on a board's CPU, each equal to PyTorch's
own kernel (:mod:`.op_checks` compares them on the configurations a model uses).

Measured on the digits step (ONNX Runtime 1.19.2, CPU, batch 32; per-node profile): the plain
decompositions spent most of the step in three nodes that ORT runs slowly, not in arithmetic:

* a convolution's weight gradient as a convolution with the output gradient as the kernel (3.7 ms
  for the 9 MFLOP of digits' second layer) where matrix products over the input's patches take
  0.6-0.7x that time at 16-96 channels and 0.05x at one (exported and timed side by side):
  :func:`patch_weight_grad` (one plain group, patches of at most :data:`PATCH_BYTES` per sample,
  beyond which the convolution form keeps memory low);
* ReLU's backward as ``Where(x <= 0, 0, grad)`` (ORT's Where broadcasting a scalar: 0.31 ms on
  65 k values) where ``grad * (x > 0)`` takes 0.09 ms: :func:`threshold_backward`.

A max pool's indices cost too (MaxPool's second output and the 1x1 MaxPool the exporter adds to
turn them into plane positions), but routing a tiling pool's gradient by comparing each window
with its maximum ran 1.5-1.8x slower than PyTorch's scatter decomposition: that one stays.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

PATCH_BYTES = 2 * 1024 * 1024  # per sample: the patches a GEMM weight gradient may hold
FEW_COLUMNS = 64  # input channels x kernel offsets up to which the patches are one stacked matrix


def _aten() -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    return torch.ops.aten


def _hint(size: Any) -> int:
    """A size as the example's value (the tracer makes sizes symbols), without a guard."""
    node = getattr(size, "node", None)
    return int(size) if node is None else int(node.hint)


def patch_weight_grad_fits(inp: Any, grad: Any, kernel: Sequence[int], groups: int) -> bool:
    """Whether :func:`patch_weight_grad` applies: one group and a small patch matrix per sample."""
    per_sample = _hint(inp.shape[1]) * math.prod(kernel) * math.prod(_hint(d) for d in grad.shape[2:])
    return groups == 1 and per_sample * inp.element_size() <= PATCH_BYTES


def patch_weight_grad(inp: Any, grad: Any, kernel: Sequence[int], stride: Sequence[int],
                      padding: Sequence[int], dilation: Sequence[int]) -> Any:  # fmt: skip
    """The weight gradient ``[C_out, C_in, *kernel]`` of ``grad = conv(inp, w)`` (one group) as
    matrix products of the output gradient ``[N, C_out, L]`` with the input's patches, each kernel
    offset a strided slice ``[N, C_in, L]`` of the padded input: one product per offset summed over
    the batch, or, for few input channels (:data:`FEW_COLUMNS` patch columns or less), one product
    with all offsets stacked (fewer, larger nodes)."""
    aten, nd = _aten(), len(kernel)
    pads = [p for i in reversed(range(nd)) for p in (padding[i], padding[i])]
    x = aten.constant_pad_nd.default(inp, pads) if any(pads) else inp
    out = [grad.shape[2 + i] for i in range(nd)]
    slices = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        s = x
        for i, k in enumerate(offset):
            start = k * dilation[i]
            s = aten.slice.Tensor(s, 2 + i, start, start + stride[i] * (out[i] - 1) + 1, stride[i])
        slices.append(s)
    n, cin, cout, taps = inp.shape[0], inp.shape[1], grad.shape[1], len(slices)
    g = grad.reshape(n, cout, -1)
    if _hint(cin) * taps <= FEW_COLUMNS:
        cols = aten.stack.default(slices, 1).reshape(n, taps * cin, -1)
        w = aten.matmul.default(g, cols.transpose(1, 2)).sum(0).reshape(cout, taps, cin).transpose(1, 2)
    else:
        per_tap = [aten.matmul.default(g, s.reshape(n, cin, -1).transpose(1, 2)).sum(0) for s in slices]
        w = aten.stack.default(per_tap, 2)
    return w.reshape(cout, cin, *kernel)


def threshold_backward(grad: Any, inp: Any, threshold: float) -> Any:
    """``aten.threshold_backward`` (ReLU's): the gradient where the input is above the threshold
    (a NaN or infinite gradient below it stays NaN, where PyTorch's kernel writes 0)."""
    return grad * (inp > threshold).to(grad.dtype)
