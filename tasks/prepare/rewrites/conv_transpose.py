"""Transposed convolutions on the gradient path: ONNX Runtime 1.19.2 has no CPU kernel for
``ConvTransposeGrad``.

A 2-D ``ConvTranspose`` is the convolution of its input with zeros inserted between the samples
(``stride - 1`` per gap), padded by ``dilation * (k - 1) - pad`` on each side (plus the output
padding at the end), with the kernel flipped in space and its in/out channels swapped per group.
The rewrite builds exactly that from Reshape, Pad (constant), Slice (positive steps), Gather (the
flip: a negative-step Slice's gradient fails in ORT 1.19.2), Transpose and Conv, all of which ORT
differentiates; the weight and bias stay the same trainable parameters. It is checked against the
original node on random data and left out if they differ.
"""

from __future__ import annotations

import numpy as np
import onnx

from tasks.prepare.graph import attr
from tasks.prepare.rewrites.rewrite_kit import Builder, rewrite_each, same_values


def _zero_insert(b: Builder, x: str, shape: list[int], stride: list[int]) -> str:
    """``x`` with ``stride - 1`` zeros between neighbouring samples along H and W."""
    _, c, h, w = shape
    (sh, sw) = stride
    if sh == sw == 1:
        return x
    t = b.op("Reshape", [x, b.const("split", [-1, c, h, 1, w, 1], np.int64)])
    t = b.op("Pad", [t, b.const("gaps", [0, 0, 0, 0, 0, 0, 0, 0, 0, sh - 1, 0, sw - 1], np.int64)])
    t = b.op("Reshape", [t, b.const("merged", [-1, c, h * sh, w * sw], np.int64)])
    ends = b.const("ends", [(h - 1) * sh + 1, (w - 1) * sw + 1], np.int64)
    return b.op("Slice", [t, b.const("starts", [0, 0], np.int64), ends, b.const("axes", [2, 3], np.int64)])


def _border(b: Builder, t: str, begin: list[int], end: list[int], size: list[int]) -> str:
    """Pad (positive) or crop (negative) the spatial borders of ``t`` (spatial size ``size``)."""
    pads = [0, 0, *(max(v, 0) for v in begin), 0, 0, *(max(v, 0) for v in end)]
    if any(pads):
        t = b.op("Pad", [t, b.const("border", pads, np.int64)])
        size = [s + max(p, 0) + max(q, 0) for s, p, q in zip(size, begin, end, strict=True)]
    if min(*begin, *end) < 0:
        starts = [max(-v, 0) for v in begin]
        ends = [s - max(-v, 0) for s, v in zip(size, end, strict=True)]
        t = b.op("Slice", [t, b.const("crop_starts", starts, np.int64), b.const("crop_ends", ends, np.int64),
                           b.const("crop_axes", [2, 3], np.int64)])  # fmt: skip
    return t


def _kernel(b: Builder, weight: str, wshape: list[int], group: int) -> str:
    """The Conv kernel ``[Cout, Cin / group, kh, kw]`` of a ConvTranspose weight ``[Cin, Cout / group, kh, kw]``."""
    cin, cout_g, kh, kw = wshape
    t = b.op("Reshape", [weight, b.const("w_groups", [group, cin // group, cout_g, kh, kw], np.int64)])
    t = b.op("Transpose", [t], perm=[0, 2, 1, 3, 4])
    t = b.op("Reshape", [t, b.const("w_conv", [group * cout_g, cin // group, kh, kw], np.int64)])
    t = b.op("Gather", [t, b.const("flip_h", list(range(kh - 1, -1, -1)), np.int64)], axis=2)
    return b.op("Gather", [t, b.const("flip_w", list(range(kw - 1, -1, -1)), np.int64)], axis=3)


def _rewrite(model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, list[int]]) -> Builder | None:
    shape, wshape = shapes.get(node.input[0], []), shapes.get(node.input[1], [])
    raw = attr(node, "auto_pad", b"NOTSET")
    if (
        len(shape) != 4
        or len(wshape) != 4
        or min(shape[1:] + wshape) <= 0
        or attr(node, "output_shape", None)
    ):
        return None
    if (raw.decode() if isinstance(raw, bytes) else raw) != "NOTSET":
        return None
    k = wshape[2:]
    stride = list(attr(node, "strides", [1, 1]))
    dil = list(attr(node, "dilations", [1, 1]))
    pads = list(attr(node, "pads", [0, 0, 0, 0]))
    extra = list(attr(node, "output_padding", [0, 0]))
    group = int(attr(node, "group", 1))
    b = Builder(model, node)
    t = _zero_insert(b, node.input[0], shape, stride)
    size = [(s - 1) * st + 1 for s, st in zip(shape[2:], stride, strict=True)]
    span = [d * (kk - 1) for d, kk in zip(dil, k, strict=True)]
    begin = [sp - p for sp, p in zip(span, pads[:2], strict=True)]
    end = [sp - p + e for sp, p, e in zip(span, pads[2:], extra, strict=True)]
    t = _border(b, t, begin, end, size)
    inputs = [t, _kernel(b, node.input[1], wshape, group)] + (
        [node.input[2]] if len(node.input) > 2 and node.input[2] else []
    )
    b.op("Conv", inputs, node.output[0], group=group, dilations=dil, kernel_shape=k)
    return b if same_values(model, node, b, shapes) else None


def conv_transposes_as_convs(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Rewrite every 2-D ConvTranspose on the gradient path as the Conv it equals; return how many."""
    return rewrite_each(model, {"ConvTranspose"}, _rewrite, trainable, any_input=True)
