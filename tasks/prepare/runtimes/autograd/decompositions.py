"""The backward operators PyTorch ships no decomposition for, written as forward operators ONNX has.

``torch._decomp.core_aten_decompositions()`` turns most backward operators into plain ones, but not
``convolution_backward`` (every kind: 1d/2d/3d, stride, dilation, padding, groups and depthwise,
transposed with output padding), ``avg_pool{2,3}d_backward``, ``_adaptive_avg_pool{2,3}d_backward``,
``adaptive_max_pool{2,3}d_backward`` or ``max_pool3d_with_indices_backward``.
Each is built here from operators the ONNX exporter writes (Conv, ConvTranspose, MatMul, ReduceSum):

* a convolution's input gradient is the transposed convolution of the output gradient with the same
  weight (a transposed convolution's, the plain convolution); its weight gradient is a convolution
  of the input, channels as batch, with the output gradient as the kernel (stride and dilation
  swap); its bias gradient a sum;
* an average pool's input gradient is the depthwise transposed convolution of the output gradient,
  divided by each window's divisor, with a kernel of ones; an adaptive one's, products with the
  constant window matrices of each spatial axis;
* a max pool's (adaptive, and 3d) adds the output gradient at the positions its indices name.

:mod:`.fast_grads` holds the forms chosen for ONNX Runtime's speed (a weight gradient as one matrix
product, ReLU's backward as a product, a tiling 2d max pool without indices).

:func:`table` gives them with PyTorch's core decompositions; :mod:`.op_checks` compares each one
with PyTorch's own kernel on the configurations a model uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from tasks.prepare.runtimes.autograd import fast_grads, strided


def _aten() -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    return torch.ops.aten


def _conv_input_grad(grad: Any, weight: Any, size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                     dilation: Sequence[int], groups: int) -> Any:  # fmt: skip
    """The input gradient of a plain convolution: a transposed one, sized back to ``size``."""
    k = weight.shape[2:]
    natural = [(grad.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k[i] - 1) + 1
               for i in range(len(size))]  # fmt: skip
    extra = [size[i] - natural[i] for i in range(len(size))]  # < stride: the rows past the last window
    return _aten().convolution.default(grad, weight, None, stride, padding, dilation, True, extra, groups)


def _conv_weight_grad(inp: Any, grad: Any, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                      dilation: Sequence[int], groups: int) -> Any:  # fmt: skip
    """The weight gradient ``[C_out, C_in / groups, *kernel]`` of ``grad = conv(inp, w)``: the input's
    channels as the batch, the output gradient as the kernel, stride and dilation swapped (or, for one
    group and small patches, one matrix product: :func:`.fast_grads.patch_weight_grad`)."""
    if fast_grads.patch_weight_grad_fits(inp, grad, kernel, groups):
        return fast_grads.patch_weight_grad(inp, grad, kernel, stride, padding, dilation)
    nd = len(kernel)
    n, cin, cout = inp.shape[0], inp.shape[1], grad.shape[1]
    cin_g, cout_g = cin // groups, cout // groups
    spatial, out_spatial = list(inp.shape[2:]), list(grad.shape[2:])
    rest = list(range(3, 3 + nd))
    x = inp.reshape(n, groups, cin_g, *spatial).permute(2, 1, 0, *rest).reshape(cin_g, groups * n, *spatial)
    g = (
        grad.reshape(n, groups, cout_g, *out_spatial)
        .permute(1, 2, 0, *rest)
        .reshape(groups * cout_g, n, *out_spatial)
    )
    w = _aten().convolution.default(x, g, None, dilation, padding, stride, False, [0] * nd, groups)
    for i in range(nd):
        w = w.narrow(2 + i, 0, kernel[i])
    return w.transpose(0, 1)


def convolution_backward(grad_out: Any, inp: Any, weight: Any, bias_sizes: Any, stride: Sequence[int],
                         padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                         output_padding: Sequence[int], groups: int, output_mask: Sequence[bool]) -> tuple:  # fmt: skip
    """``aten.convolution_backward``: (input, weight, bias) gradients, None where not asked for."""
    nd = inp.dim() - 2
    stride, padding, dilation = _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd)
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:  # the adjoint of a transposed convolution is the plain one
            gi = _aten().convolution.default(
                grad_out, weight, None, stride, padding, dilation, False, [0] * nd, groups
            )
            gi = _fit(gi, inp.shape[2:])
        else:
            gi = _conv_input_grad(grad_out, weight, list(inp.shape[2:]), stride, padding, dilation, groups)
    if output_mask[1]:
        kernel = list(weight.shape[2:])
        if transposed:  # y = convT(x, w) is x = conv(y, w) read backwards: the roles swap
            gw = _conv_weight_grad(grad_out, inp, kernel, stride, padding, dilation, groups)
        else:
            gw = _conv_weight_grad(inp, grad_out, kernel, stride, padding, dilation, groups)
    if output_mask[2]:
        gb = grad_out.sum(dim=[0, *range(2, grad_out.dim())])
    return gi, gw, gb


def _fit(t: Any, size: Sequence[int]) -> Any:
    """``t`` narrowed or zero-padded on the right of each spatial axis to ``size``."""
    for i, want in enumerate(size):
        have = t.shape[2 + i]
        if have > want:
            t = t.narrow(2 + i, 0, want)
        elif have < want:
            pad = [0, 0] * (len(size) - 1 - i) + [0, want - have]
            t = _aten().constant_pad_nd.default(t, pad, 0.0)
    return t


def _expand(values: Sequence[int] | int, nd: int) -> list[int]:
    values = [values] if isinstance(values, int) else list(values)
    return values * nd if len(values) == 1 else values


def pool_divisors(size: int, out: int, k: int, s: int, p: int, include_pad: bool) -> list[int]:
    """The divisor of each of the ``out`` positions of one axis of ``avg_pool`` (PyTorch's rule: the
    window clipped to the padded input, or to the input itself without ``count_include_pad``)."""
    divisors = []
    for o in range(out):
        start = o * s - p
        end = min(start + k, size + p)
        padded = end - start
        start, end = max(start, 0), min(end, size)
        divisors.append(padded if include_pad else end - start)
    return divisors


def avg_pool_backward(grad_out: Any, inp: Any, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                      ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Any:  # fmt: skip
    """``aten.avg_pool{2,3}d_backward``: each output gradient divided by its window's divisor,
    spread over the window by a depthwise transposed convolution with a kernel of ones."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    nd = len(kernel)
    stride = _expand(stride, nd) if stride else list(kernel)
    kernel, padding = _expand(kernel, nd), _expand(padding, nd)
    spatial = list(inp.shape[-nd:])
    if divisor_override:
        scaled = grad_out / divisor_override
    else:
        axes = [pool_divisors(spatial[i], grad_out.shape[-nd + i], kernel[i], stride[i], padding[i], count_include_pad)
                for i in range(nd)]  # fmt: skip
        divisor = torch.tensor([math.prod(c) for c in _grid(axes)]).reshape(*(len(a) for a in axes))
        scaled = grad_out / divisor.to(grad_out.dtype)
    channels = inp.shape[-nd - 1]
    batched = scaled if inp.dim() == nd + 2 else scaled.unsqueeze(0)
    ones = torch.ones(channels, 1, *kernel, dtype=grad_out.dtype)
    natural = [(batched.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + kernel[i] for i in range(nd)]
    extra = [max(0, spatial[i] - natural[i]) for i in range(nd)]  # < stride: what the last window reaches
    gi = _aten().convolution.default(batched, ones, None, stride, padding, [1] * nd, True, extra, channels)
    gi = _fit(gi, spatial)
    return gi if inp.dim() == nd + 2 else gi.squeeze(0)


def _grid(axes: list[list[int]]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for axis in axes:
        out = [(*head, v) for head in out for v in axis]
    return out


def adaptive_windows(size: int, out: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` input window of each output position of an adaptive pool's axis."""
    return [((o * size) // out, -((-(o + 1) * size) // out)) for o in range(out)]


def adaptive_avg_pool_backward(grad_out: Any, inp: Any, nd: int = 2) -> Any:
    """``aten._adaptive_avg_pool{2,3}d_backward``: per spatial axis, the output gradient times the
    constant matrix spreading each window's mean back over its inputs."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    g = grad_out
    for axis in range(-nd, 0):
        size, out = inp.shape[axis], grad_out.shape[axis]
        spread = torch.zeros(out, size, dtype=grad_out.dtype)
        for o, (start, end) in enumerate(adaptive_windows(size, out)):
            spread[o, start:end] = 1.0 / (end - start)
        g = torch.matmul(g.movedim(axis, -1), spread).movedim(-1, axis)
    return g


def _adaptive3d(grad_out: Any, inp: Any) -> Any:
    return adaptive_avg_pool_backward(grad_out, inp, 3)


def scatter_pool_backward(grad_out: Any, inp: Any, indices: Any, nd: int) -> Any:
    """A max pool's input gradient from its indices (flat positions in each channel's plane of
    ``nd`` axes): the output gradient added at those positions (ScatterElements, reduction add)."""
    lead = list(inp.shape[:-nd])
    zeros = inp.new_zeros([*lead, math.prod(inp.shape[-nd:])])
    flat = grad_out.reshape(*lead, -1)
    return zeros.scatter_add(-1, indices.reshape(*lead, -1), flat).reshape(inp.shape)


def _adaptive_max2d(grad_out: Any, inp: Any, indices: Any) -> Any:
    return scatter_pool_backward(grad_out, inp, indices, 2)


def _adaptive_max3d(grad_out: Any, inp: Any, indices: Any) -> Any:
    return scatter_pool_backward(grad_out, inp, indices, 3)


def _max_pool3d_backward(grad_out: Any, inp: Any, kernel: Any, stride: Any, padding: Any, dilation: Any,
                         ceil_mode: bool, indices: Any) -> Any:  # fmt: skip
    return scatter_pool_backward(grad_out, inp, indices, 3)


def squeeze_dims(x: Any, dims: Sequence[int]) -> Any:
    """``aten.squeeze.dims`` (a cross-entropy's gathered targets) as one ``squeeze.dim`` per axis,
    which the ONNX exporter converts (core ATen's decompositions turn ``squeeze.dim`` into
    ``squeeze.dims``, which it does not: the step was re-traced to decompose it)."""
    aten = _aten()
    for d in sorted({d % max(x.dim(), 1) for d in dims}, reverse=True):
        x = aten.squeeze.dim(x, d)
    return x


def table() -> dict[Any, Callable[..., Any]]:
    """PyTorch's core decompositions, its max-pool backward and dropout ones, and the ones of this module."""
    from torch._decomp import core_aten_decompositions, decomposition_table  # torch's own tables

    aten = _aten()
    out = dict(core_aten_decompositions())
    for op in (aten.native_dropout.default,):  # random: see .noise
        out[op] = decomposition_table[op]
    out.pop(aten.squeeze.dim)  # kept: the ONNX exporter converts it, where core's form it does not
    out[aten.squeeze.dims] = squeeze_dims
    out.update(own_table())
    return out


def forward_table() -> dict[Any, Callable[..., Any]]:
    """:func:`table` for decomposing a model's forward before it is differentiated: without our forms
    of forward operators (a tiling max pool), which must stay operators with their autograd formula
    (differentiated, their strided slices would come back as ScatterND in the backward)."""
    out = table()
    out.pop(_aten().max_pool2d_with_indices.default)
    return out


def own_table() -> dict[Any, Callable[..., Any]]:
    """The decompositions of this module, by the operator they replace."""
    aten = _aten()
    return {
        aten.convolution_backward.default: convolution_backward,
        aten.avg_pool2d_backward.default: avg_pool_backward,
        aten.avg_pool3d_backward.default: avg_pool_backward,
        aten._adaptive_avg_pool2d_backward.default: adaptive_avg_pool_backward,
        aten._adaptive_avg_pool3d_backward.default: _adaptive3d,
        aten.adaptive_max_pool2d_backward.default: _adaptive_max2d,
        aten.adaptive_max_pool3d_backward.default: _adaptive_max3d,
        aten.max_pool3d_with_indices_backward.default: _max_pool3d_backward,
        aten.threshold_backward.default: fast_grads.threshold_backward,
        aten.max_pool2d_with_indices.default: fast_grads.max_pool2d_with_indices,
        aten.max_pool2d_with_indices_backward.default: fast_grads.max_pool2d_with_indices_backward,
        aten.as_strided_scatter.default: strided.as_strided_scatter,
    }
