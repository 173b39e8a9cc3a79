"""Backward decompositions chosen for ONNX Runtime's speed on a board's CPU, each equal to PyTorch's
own kernel (:mod:`.op_checks` compares them on the configurations a model uses).

Measured on the digits step (ONNX Runtime 1.19.2, CPU, batch 32; per-node profile): the plain
decompositions spent most of the step in three nodes that ORT runs slowly, not in arithmetic:

* a convolution's weight gradient as a convolution with the output gradient as the kernel (3.7 ms
  for the 9 MFLOP of digits' second layer) where matrix products over the input's patches take
  0.6-0.7x that time at 16-96 channels and 0.05x at one (exported and timed side by side):
  :func:`patch_weight_grad` (one plain group, patches of at most :data:`PATCH_BYTES` per sample,
  beyond which the convolution form keeps memory low). The patches are one grouped convolution
  with one-hot kernels, not a strided slice per kernel offset: the same step speed (digits 30 k
  samples/s against ORT's 25 k) with a step of a few nodes per layer (a small UNet's: 379 nodes,
  911 with slices, its preparation 10 s instead of 18 s);
* ReLU's backward as ``Where(x <= 0, 0, grad)`` (ORT's Where broadcasting a scalar: 0.31 ms on
  65 k values) where ``grad * (x > 0)`` takes 0.09 ms: :func:`threshold_backward`.

* a max pool's indices (MaxPool's second output, the 1x1 MaxPool the exporter adds to turn them into
  plane positions, the ScatterElements of their backward: 43 % of digits' step): a pool whose
  windows tile the input (kernel = stride, no padding or dilation) takes its values as an
  elementwise Max of the window offsets' strided slices and sends each window's gradient to its
  first maximum, as PyTorch's kernel does, by comparing those slices with the values, so the
  indices are never computed (:func:`max_pool2d_with_indices` and its backward: 1.4-1.8x faster
  on 64 k to 800 k values; a 7x7 map's 0.4 ms slower, its nodes' fixed cost). Overlapping or padded
  pools keep PyTorch's scatter decomposition.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

PATCH_BYTES = 2 * 1024 * 1024  # per sample: the patches a GEMM weight gradient may hold


def _aten() -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    return torch.ops.aten


def example_size(size: Any) -> int:
    """A size as an int: a symbolic one (the tracer makes every size a symbol) as the example's value
    it stands for, read without adding a guard to the trace."""
    node = getattr(size, "node", None)
    return int(size) if node is None else int(node.hint)


def patch_weight_grad_fits(inp: Any, grad: Any, kernel: Sequence[int], groups: int) -> bool:
    """Whether :func:`patch_weight_grad` applies: one group and a small patch matrix per sample."""
    per_sample = (
        example_size(inp.shape[1]) * math.prod(kernel) * math.prod(example_size(d) for d in grad.shape[2:])
    )
    return groups == 1 and per_sample * inp.element_size() <= PATCH_BYTES


def patch_weight_grad(inp: Any, grad: Any, kernel: Sequence[int], stride: Sequence[int],
                      padding: Sequence[int], dilation: Sequence[int]) -> Any:  # fmt: skip
    """The weight gradient ``[C_out, C_in, *kernel]`` of ``grad = conv(inp, w)`` (one group) as one
    matrix product per sample of the output gradient ``[N, C_out, L]`` with the input's patches
    ``[N, C_in x taps, L]``, summed over the batch. The patches come from one grouped convolution
    whose kernels are one-hot (output channel ``c x taps + t`` copies input channel ``c`` at kernel
    offset ``t``), so the step has the same few nodes at any kernel size, where a strided slice per
    offset made a UNet's step 900 nodes long and its preparation 8x ORT's."""
    aten = _aten()
    taps = math.prod(kernel)
    n, cin, cout = inp.shape[0], example_size(inp.shape[1]), grad.shape[1]
    one_hot = aten.eye.default(taps, dtype=inp.dtype).repeat(cin, 1).reshape(cin * taps, 1, *kernel)
    cols = aten.convolution.default(inp, one_hot, None, list(stride), list(padding), list(dilation), False,
                                    [0] * len(kernel), cin)  # fmt: skip
    for i in range(len(kernel)):  # a transposed convolution's output padding: positions past the gradient's
        if example_size(cols.shape[2 + i]) != example_size(grad.shape[2 + i]):
            cols = cols.narrow(2 + i, 0, grad.shape[2 + i])
    cols = cols.reshape(n, cin * taps, -1)
    w = aten.matmul.default(grad.reshape(n, cout, -1), cols.transpose(1, 2)).sum(0)
    return w.reshape(cout, cin, *kernel)


def threshold_backward(grad: Any, inp: Any, threshold: float) -> Any:
    """``aten.threshold_backward`` (ReLU's): the gradient where the input is above the threshold
    (a NaN or infinite gradient below it stays NaN, where PyTorch's kernel writes 0)."""
    return grad * (inp > threshold).to(grad.dtype)


def _pair(values: Sequence[int], default: Sequence[int]) -> list[int]:
    v = list(values) or list(default)
    return v * 2 if len(v) == 1 else v


def tiling_kernel(x: Any, kernel: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,),
                  dilation: Sequence[int] = (1,), ceil_mode: bool = False) -> list[int] | None:  # fmt: skip
    """The kernel of a 2d max pool whose windows tile ``x`` (kernel = stride, no padding or dilation;
    rows and columns past the last whole window dropped, unless ceil mode would pool them), else None."""
    k = _pair(kernel, kernel)
    if _pair(stride, k) != k or _pair(padding, [0]) != [0, 0] or _pair(dilation, [1]) != [1, 1]:
        return None
    if ceil_mode and any(example_size(x.shape[-2 + i]) % k[i] for i in range(2)):
        return None
    return k


def _taps(x: Any, k: list[int], oh: Any, ow: Any) -> list[Any]:
    """Each window offset's values ``[..., oh, ow]`` (strided slices), in PyTorch's scan order."""
    aten = _aten()
    return [
        aten.slice.Tensor(aten.slice.Tensor(x, -2, i, i + k[0] * (oh - 1) + 1, k[0]), -1, j, j + k[1] * (ow - 1) + 1, k[1])
        for i in range(k[0])
        for j in range(k[1])
    ]  # fmt: skip


def max_pool2d_with_indices(x: Any, kernel: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,),
                            dilation: Sequence[int] = (1,), ceil_mode: bool = False) -> Any:  # fmt: skip
    """``aten.max_pool2d_with_indices`` of a tiling pool: the values an elementwise Max of the window
    offsets' strided slices; the indices (flat positions in each plane) traced apart, so an export
    drops them when nothing reads them. NotImplemented (PyTorch's operator) for any other pool."""
    k = tiling_kernel(x, kernel, stride, padding, dilation, ceil_mode)
    if k is None:
        return NotImplemented
    aten = _aten()
    oh, ow = x.shape[-2] // k[0], x.shape[-1] // k[1]
    taps = _taps(x, k, oh, ow)
    values = functools.reduce(aten.maximum.default, taps)
    first = _first_hits(taps, values)
    tap = functools.reduce(aten.add.Tensor, [m * t for t, m in enumerate(first)]).to(_torch().int64)
    rows = aten.arange.default(oh).reshape(oh, 1) * k[0] + tap // k[1]
    cols = aten.arange.default(ow).reshape(1, ow) * k[1] + tap % k[1]
    return values, rows * x.shape[-1] + cols


def _first_hits(taps: list[Any], values: Any) -> list[Any]:
    """Per offset, 1 where its value is the window's first maximum (PyTorch keeps the first), else 0."""
    out, seen = [], None
    for t in taps:
        hit = t == values
        hit = hit if seen is None else hit & ~seen
        seen = hit if seen is None else seen | hit
        out.append(hit.to(values.dtype))
    return out


def max_pool2d_with_indices_backward(grad: Any, x: Any, kernel: Sequence[int], stride: Sequence[int],
                                     padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool,
                                     indices: Any) -> Any:  # fmt: skip
    """The input gradient of a 2d max pool: for a tiling one, each window's output gradient at its
    first maximum, from the input's strided slices (no indices, no scatter); any other, PyTorch's
    scatter decomposition."""
    k = tiling_kernel(x, kernel, stride, padding, dilation, ceil_mode)
    if k is None:
        from torch._decomp import decomposition_table  # PyTorch's own, for pools that overlap or pad

        op = _aten().max_pool2d_with_indices_backward.default
        return decomposition_table[op](grad, x, kernel, stride, padding, dilation, ceil_mode, indices)
    aten = _aten()
    oh, ow = grad.shape[-2], grad.shape[-1]
    taps = _taps(x, k, oh, ow)
    parts = [grad * m for m in _first_hits(taps, functools.reduce(aten.maximum.default, taps))]
    rows = [aten.stack.default(parts[i * k[1] : (i + 1) * k[1]], -1).reshape(*grad.shape[:-1], ow * k[1])
            for i in range(k[0])]  # fmt: skip
    full = aten.stack.default(rows, -2).reshape(*grad.shape[:-2], oh * k[0], ow * k[1])
    pad = [0, x.shape[-1] - ow * k[1], 0, x.shape[-2] - oh * k[0]]  # rows/columns no window reached
    return aten.constant_pad_nd.default(full, pad) if any(example_size(p) for p in pad) else full


def _torch() -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    return torch
