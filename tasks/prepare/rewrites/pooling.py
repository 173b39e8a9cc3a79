"""Fixed-kernel average pooling on the gradient path, rewritten as a depthwise convolution.

ONNX Runtime 1.19.2's ``AveragePoolGrad`` (CPU) takes the shape of its output, the pooling input's
gradient, from the *static* graph shape when the session is created: a symbolic dimension (the
dynamic batch every artifact has) reads as 0. The gradient is then a zero-size tensor, and whatever
meets it next fails: the broadcasting ``Mul`` of a frozen BatchNorm or a squeeze-excitation gate
("Can broadcast 0 by 0 or 1"), or an integer division in a later kernel (the probe dies on SIGFPE).
``F.avg_pool2d(x, 4)``, ``nn.AvgPool2d(2)`` in dense-block transitions and ResNet-D's
``AvgPool2d(2, ceil_mode=True, count_include_pad=False)`` all export as such an AveragePool.

Average pooling is linear, so each one whose input needs a gradient becomes
``Conv(x, ones[C, 1, kh, kw], group=C) * inv_count`` (``ConvGrad`` reads every shape at run time):
the convolution sums each window over the elements inside the input, ``inv_count[i, j]`` is one over
the divisor ONNX Runtime's own AveragePool uses at output position ``(i, j)``. ``inv_count`` is
measured by running that AveragePool on ones, so padding, ``count_include_pad`` and ``ceil_mode``
(extra end padding on the convolution) mean what they mean in the runtime. Each rewrite is checked
against the original node on random data and left out if they differ.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tasks.prepare.graph import attr, quiet_session
from tasks.prepare.rewrites.rewrite_kit import Builder, rewrite_each, same_values


def _run(
    nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray], out: str
) -> np.ndarray:
    """Run ``nodes`` alone in an ONNX Runtime session (opset 17) on ``inputs`` and ``consts``."""

    graph = helper.make_graph(
        nodes,
        "pool",
        [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = quiet_session(model)
    return sess.run([out], inputs)[0]


def _pads(node: onnx.NodeProto, spatial: list[int], out_spatial: list[int]) -> tuple[list[int], list[int]]:
    """Begin and end pads of a convolution giving the pool's output size."""
    k = list(attr(node, "kernel_shape", []))
    strides = list(attr(node, "strides", [1] * len(k)))
    dil = list(attr(node, "dilations", [1] * len(k)))
    n = len(k)
    raw = attr(node, "auto_pad", b"NOTSET")
    auto = raw.decode() if isinstance(raw, bytes) else str(raw)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [
            max(0, (o - 1) * s + (kk - 1) * d + 1 - i)
            for o, s, kk, d, i in zip(out_spatial, strides, k, dil, spatial, strict=True)
        ]
        small = [t // 2 for t in total]
        begin = small if auto == "SAME_UPPER" else [t - b for t, b in zip(total, small, strict=True)]
        end = [t - b for t, b in zip(total, begin, strict=True)]
    elif auto == "VALID":
        begin, end = [0] * n, [0] * n
    else:
        pads = list(attr(node, "pads", [0] * 2 * n))
        begin, end = pads[:n], pads[n:]
    # the convolution's floor output must equal the pool's (ceil_mode adds a window at the end)
    end = [max(e, (o - 1) * s + (kk - 1) * d + 1 - i - b) for e, o, s, kk, d, i, b in
           zip(end, out_spatial, strides, k, dil, spatial, begin, strict=True)]  # fmt: skip
    return begin, end


def _rewrite(model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, list[int]]) -> Builder | None:
    """The Conv (and Mul) computing ``node`` exactly, checked on random data, or None."""
    x, y = node.input[0], node.output[0]
    shape, out = shapes.get(x, []), shapes.get(y, [])
    k = list(attr(node, "kernel_shape", []))
    if len(shape) != len(k) + 2 or len(out) != len(shape) or min(shape[1:] + out[2:], default=-1) <= 0:
        return None
    pads = _pads(node, shape[2:], out[2:])
    if len(node.output) != 1:
        return None
    channels, spatial = shape[1], shape[2:]
    conv_attrs = {
        "group": channels,
        "kernel_shape": k,
        "strides": list(attr(node, "strides", [1] * len(k))),
        "dilations": list(attr(node, "dilations", [1] * len(k))),
        "pads": [*pads[0], *pads[1]],
    }
    ones = np.ones((1, 1, *spatial), np.float32)
    window = np.ones((1, 1, *k), np.float32)
    summed = _run(
        [helper.make_node("Conv", ["x", "w"], ["s"], **{**conv_attrs, "group": 1})],
        {"x": ones},
        {"w": window},
        "s",
    )
    probe = helper.make_node(
        "AveragePool", ["x"], ["a"], **{a.name: helper.get_attribute_value(a) for a in node.attribute}
    )
    averaged = _run([probe], {"x": ones}, {}, "a")
    if summed.shape != averaged.shape or (summed <= 0).any():
        return None
    inv = (averaged / summed).astype(np.float32)
    uniform = bool(np.allclose(inv, inv.flat[0], rtol=0, atol=0))
    b = Builder(model, node)
    weight = b.const("sum_window", np.ones((channels, 1, *k), np.float32) * (inv.flat[0] if uniform else 1.0))
    if uniform:
        b.op("Conv", [x, weight], y, **conv_attrs)
    else:
        b.op("Mul", [b.op("Conv", [x, weight], **conv_attrs), b.const("inv_count", inv)], y)
    return b if same_values(model, node, b, shapes) else None


def average_pools_as_convs(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Rewrite every AveragePool whose input needs a gradient as a depthwise Conv; return how many."""
    return rewrite_each(model, {"AveragePool"}, _rewrite, trainable)
