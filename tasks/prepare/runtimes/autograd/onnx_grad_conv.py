"""A convolution's weight gradient for :mod:`.onnx_grad_nn`, in operators a board's inference build
runs, written the way that costs the board least for its sizes.

A 1x1 kernel without stride or padding, or a small one (its input's patches and the product within
:data:`PATCHES_BYTES` a sample: a digits CNN's): the patches (one grouped convolution by a one-hot
kernel: [N, C_in * taps, ...]; the input itself for the 1x1) times the output gradient, one batched
MatMul per group, summed over the samples: few, fast nodes; a 1x1 over fewer positions than output
channels (a head) folds the samples into the product instead. Any other: one convolution of the
input by the output gradient, the samples as channels and each group's input channels as the
batch (its stride the forward's dilation, its dilation the forward's stride), cut to the kernel: no
patches are held, ONNX Runtime's convolution unfolds one sample at a time, as its own training
graphs' ConvGrad does (smp's PSPNet decoder held 81 MB of patches and products at batch 4; the
agent's peak was 1.35x ORT's).
"""

from __future__ import annotations

import numpy as np

from tasks.prepare.runtimes.autograd.onnx_grad import Builder, Unsupported

# a sample's patches and weight-sized product, in bytes, up to which they are made (the digits step:
# 1.3 ms by patches, 1.6 by the convolution form; a 1x1 64 -> 256 over 56x56: 3 against 31 ms)
PATCHES_BYTES = 256 * 1024


def weight_grad(b: Builder, inp: str, gout: str, sizes: tuple[list[int], list[int]], groups: int,
                kernel: list[int], strides: list[int], dilations: list[int], pads: list[int], weight: list[int]) -> str:  # fmt: skip
    """The gradient of a convolution's weight (shaped ``weight``: [C_out, C_in / groups, *kernel])
    from its input ``inp`` [N, C_in, ...] and output gradient ``gout`` [N, C_out, ...]; ``sizes``:
    the spatial sizes of ``inp`` and ``gout``."""
    n = len(kernel)
    sizes, out_sizes = sizes
    got = [(s + p0 + p1 - d * (k - 1) - 1) // st + 1
           for s, p0, p1, d, k, st in zip(sizes, pads[:n], pads[n:], dilations, kernel, strides, strict=True)]  # fmt: skip
    if got != list(out_sizes):
        raise Unsupported("a convolution whose gradient's size is not its output's")
    c_in, taps, length = weight[1] * groups, int(np.prod(kernel)), int(np.prod(out_sizes))
    unfolded = taps > 1 or any(pads) or any(st != 1 for st in strides)
    if not unfolded and length < weight[0] // groups:
        return _samples_folded(b, inp, gout, groups, weight, length)
    if not unfolded or (c_in * taps * length + int(np.prod(weight))) * 4 <= PATCHES_BYTES:
        return _by_patches(b, inp, gout, unfolded, groups, kernel, strides, dilations, pads, weight, length)
    return _by_convolution(b, inp, gout, (sizes, out_sizes), groups, kernel, strides, dilations, pads, weight)


def _by_patches(b: Builder, inp: str, gout: str, unfolded: bool, groups: int, kernel: list[int], strides: list[int],
                dilations: list[int], pads: list[int], weight: list[int], length: int) -> str:  # fmt: skip
    c_out, c_in_group = weight[:2]
    c_in, taps = c_in_group * groups, int(np.prod(kernel))
    patches = inp
    if unfolded:  # each input channel's taps, one-hot: an identity tiled over the channels in the graph (a
        # [C_in * taps, 1, *kernel] constant was 311 KB of smp's U-Net step for each depthwise layer)
        eye = b.const(np.eye(taps, dtype=np.float32).reshape(taps, 1, *kernel))
        onehot = b.op("Tile", eye, b.ints([c_in, 1, *([1] * len(kernel))]))
        patches = b.op("Conv", inp, onehot, group=c_in, strides=strides, dilations=dilations, pads=pads,
                       kernel_shape=kernel)  # fmt: skip
    patches = b.op("Reshape", patches, b.ints([-1, groups, c_in_group * taps, length]))
    g = b.op(
        "Transpose", b.op("Reshape", gout, b.ints([-1, groups, c_out // groups, length])), perm=[0, 1, 3, 2]
    )
    gw = b.op("ReduceSum", b.op("MatMul", patches, g), b.ints([0]), keepdims=0)  # [G, Cg * taps, Og]
    return b.op("Reshape", b.op("Transpose", gw, perm=[0, 2, 1]), b.ints(weight))


def _samples_folded(b: Builder, inp: str, gout: str, groups: int, weight: list[int], length: int) -> str:
    """A 1x1 kernel over fewer positions than a group's output channels (a classifier's head): the
    samples and positions folded into one product axis, [G, Og, N * L] times [G, N * L, Cg], so no
    [N, ...] weight-sized products are held (timm's lcnetv2 head: 15 MB at batch 4)."""
    c_out, c_in_group = weight[:2]
    g = b.op("Reshape", gout, b.ints([-1, groups, c_out // groups, length]))
    g = b.op("Reshape", b.op("Transpose", g, perm=[1, 2, 0, 3]), b.ints([groups, c_out // groups, -1]))
    x = b.op("Reshape", inp, b.ints([-1, groups, c_in_group, length]))
    x = b.op("Reshape", b.op("Transpose", x, perm=[1, 0, 3, 2]), b.ints([groups, -1, c_in_group]))
    return b.op("Reshape", b.op("MatMul", g, x), b.ints(weight))  # [G, Og, Cg] -> the weight's layout


def _by_convolution(b: Builder, inp: str, gout: str, sizes: tuple[list[int], list[int]], groups: int,
                    kernel: list[int], strides: list[int], dilations: list[int], pads: list[int],
                    weight: list[int]) -> str:  # fmt: skip
    n = len(kernel)
    sizes, out_sizes = sizes
    # from the weight, not from ``inp``: a ConvTranspose passes its output gradient, whose shape
    # the graph's inference never saw (its weight gradient was traced for that: 4.6x ORT's time)
    c_in_group = weight[1]
    # [N, G * Cg, *S] -> [Cg, G * N, *S]; [N, G * Og, *O] -> [G * Og, N, *O]
    xs = b.op("Reshape", inp, b.ints([-1, groups, c_in_group, *sizes]))
    xs = b.op(
        "Reshape", b.op("Transpose", xs, perm=[2, 1, 0, *range(3, n + 3)]), b.ints([c_in_group, -1, *sizes])
    )
    gs = b.op("Transpose", gout, perm=[1, 0, *range(2, n + 2)])
    span = [(s + p0 + p1 - st * (o - 1) - 1) // d + 1
            for s, p0, p1, st, o, d in zip(sizes, pads[:n], pads[n:], strides, out_sizes, dilations, strict=True)]  # fmt: skip
    gw = b.op(
        "Conv", xs, gs, group=groups, strides=dilations, dilations=strides, pads=pads, kernel_shape=out_sizes
    )
    if span != list(kernel):  # positions past the last the forward reached
        gw = b.op("Slice", gw, b.ints([0] * n), b.ints(kernel), b.ints(list(range(2, n + 2))))
    return b.op("Transpose", gw, perm=[1, 0, *range(2, n + 2)])  # [Cg, C_out, *K] -> the weight's layout
