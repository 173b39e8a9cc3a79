"""Operators ONNX Runtime 1.19.2 cannot differentiate on the CPU, rewritten as the operators they
are made of, where they lie between a trainable parameter and the loss.

Each rewrite computes the same values (tested against the original node) with operators whose
gradients ORT has: ``Elu``, ``Selu``, ``Celu`` and ``Softplus`` (Mish) from Relu/Min/Exp/Log (the exponential only ever sees
``min(x, 0)``, so its gradient never overflows); ``PRelu`` as ``relu(x) - slope * relu(-x)`` (the
slope stays a trainable parameter of the same name); ``InstanceNormalization`` (also what
``GroupNorm`` exports as) from ReduceMean/Sqrt; ``DepthToSpace`` / ``SpaceToDepth`` (PixelShuffle)
as the Reshape/Transpose/Reshape the ONNX specification defines them by; a ``Pad`` in reflect or
edge mode (ORT's Pad gradient is constant-mode only) from Gathers and a Concat per padded axis;
``ReduceMax`` / ``ReduceMin`` over a contiguous run of axes (``x.max(dim=1)``, ``amax``) as ``TopK``.
"""

from __future__ import annotations

import numpy as np
import onnx

from tasks.prepare.graph import attr, downstream, observed_shapes
from tasks.prepare.rewrites.rewrite_kit import Builder, apply_rewrites, same_values, static_value


def _elu_like(b: Builder, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    x, y = node.input[0], node.output[0]
    alpha = float(attr(node, "alpha", {"Selu": 1.67326319217681884765625}.get(node.op_type, 1.0)))
    gamma = float(attr(node, "gamma", 1.05070102214813232421875)) if node.op_type == "Selu" else 1.0
    neg = b.op("Min", [x, b.const("zero", 0.0)])
    if node.op_type == "Celu":
        neg = b.op("Div", [neg, b.const("alpha", alpha)])
    expm1 = b.op("Sub", [b.op("Exp", [neg]), b.const("one", 1.0)])
    total = b.op("Add", [b.op("Relu", [x]), b.op("Mul", [expm1, b.const("alpha_scale", alpha)])])
    b.op("Mul", [total, b.const("gamma", gamma)], y)
    return b.nodes


def _softplus(b: Builder, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """softplus(x) = relu(x) + log(1 + exp(-|x|)), with -|x| = min(x, 0) - relu(x): never overflows."""
    x = node.input[0]
    pos = b.op("Relu", [x])
    neg_abs = b.op("Sub", [b.op("Min", [x, b.const("zero", 0.0)]), pos])
    log1p = b.op("Log", [b.op("Add", [b.op("Exp", [neg_abs]), b.const("one", 1.0)])])
    b.op("Add", [pos, log1p], node.output[0])
    return b.nodes


def _prelu(b: Builder, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    x, slope = node.input[0], node.input[1]
    negative = b.op("Mul", [b.op("Relu", [b.op("Neg", [x])]), slope])
    b.op("Sub", [b.op("Relu", [x]), negative], node.output[0])
    return b.nodes


def _reduce_mean(b: Builder, x: str, axes: list[int], opset: int) -> str:
    if opset >= 18:
        return b.op("ReduceMean", [x, b.const(f"axes{b.count}", axes, np.int64)], keepdims=1)
    return b.op("ReduceMean", [x], axes=axes, keepdims=1)


def _instance_norm(b: Builder, node: onnx.NodeProto, rank: int, opset: int) -> list[onnx.NodeProto]:
    x, scale, bias = node.input[:3]
    axes = list(range(2, rank))
    centred = b.op("Sub", [x, _reduce_mean(b, x, axes, opset)])
    var = _reduce_mean(b, b.op("Mul", [centred, centred]), axes, opset)
    eps = b.const("epsilon", float(attr(node, "epsilon", 1e-5)))
    normed = b.op("Div", [centred, b.op("Sqrt", [b.op("Add", [var, eps])])])
    shape = b.const("affine_shape", [-1] + [1] * (rank - 2), np.int64)
    scaled = b.op("Mul", [normed, b.op("Reshape", [scale, shape])])
    b.op("Add", [scaled, b.op("Reshape", [bias, shape])], node.output[0])
    return b.nodes


def _depth_space(b: Builder, node: onnx.NodeProto, shape: list[int]) -> list[onnx.NodeProto]:
    bs = int(attr(node, "blocksize", 1))
    _, c, h, w = shape
    raw = attr(node, "mode", b"DCR")
    mode = raw.decode() if isinstance(raw, bytes) else str(raw)
    if node.op_type == "DepthToSpace":
        first, perm = (
            ([-1, bs, bs, c // bs**2, h, w], [0, 3, 4, 1, 5, 2])
            if mode == "DCR"
            else ([-1, c // bs**2, bs, bs, h, w], [0, 1, 4, 2, 5, 3])
        )
        last = [-1, c // bs**2, h * bs, w * bs]
    else:
        first, perm, last = (
            [-1, c, h // bs, bs, w // bs, bs],
            [0, 3, 5, 1, 2, 4],
            [-1, c * bs * bs, h // bs, w // bs],
        )
    t = b.op("Reshape", [node.input[0], b.const("first_shape", first, np.int64)])
    t = b.op("Transpose", [t], perm=perm)
    b.op("Reshape", [t, b.const("last_shape", last, np.int64)], node.output[0])
    return b.nodes


def _pad(
    b: Builder, node: onnx.NodeProto, shape: list[int], pads: list[int], mode: str
) -> list[onnx.NodeProto]:
    """Reflect/edge padding as Gathers of the mirrored or repeated indices, concatenated per axis
    (Gather's gradient exists; Slice's with a negative step fails at run time in ORT 1.19.2)."""
    x, rank = node.input[0], len(shape)
    for axis in range(rank):
        before, after, size = pads[axis], pads[rank + axis], shape[axis]
        if not (before or after):
            continue
        if mode == "reflect":
            left, right = list(range(before, 0, -1)), list(range(size - 2, size - 2 - after, -1))
        else:
            left, right = [0] * before, [size - 1] * after
        parts = [b.op("Gather", [x, b.const(f"left{axis}", left, np.int64)], axis=axis)] if before else []
        parts.append(x)
        parts += [b.op("Gather", [x, b.const(f"right{axis}", right, np.int64)], axis=axis)] if after else []
        x = b.op("Concat", parts, axis=axis)
    b.nodes[-1].output[0] = node.output[0]
    return b.nodes


def _reduce_extreme(
    b: Builder, node: onnx.NodeProto, shape: list[int], axes: list[int]
) -> list[onnx.NodeProto]:
    """ReduceMax/ReduceMin over a contiguous run of axes as TopK(k=1) over them flattened (TopK's
    gradient exists, ReduceMax's does not in ORT 1.19.2)."""
    rank = len(shape)
    first, last = axes[0], axes[-1]
    merged = [-1 if a == 0 else shape[a] for a in range(first)] + [int(np.prod([shape[a] for a in axes]))]
    merged += [shape[a] for a in range(last + 1, rank)]
    t = b.op("Reshape", [node.input[0], b.const("merged", merged, np.int64)])
    k = b.const("k", [1], np.int64)
    top = b.op("TopK", [t, k], axis=first, largest=int(node.op_type == "ReduceMax"))
    b.nodes[-1].output.append(f"{b.prefix}/indices")
    keep = int(attr(node, "keepdims", 1))
    out = [-1 if a == 0 else (1 if a in axes else shape[a]) for a in range(rank) if keep or a not in axes]
    b.op("Reshape", [top, b.const("out_shape", out, np.int64)], node.output[0])
    return b.nodes


def _pads_of(model: onnx.ModelProto, node: onnx.NodeProto) -> list[int] | None:
    if len(node.input) > 1 and node.input[1]:
        value = static_value(model, node.input[1])
        return None if value is None else [int(v) for v in value.reshape(-1)]
    return [int(v) for v in attr(node, "pads", [])] or None


def _rewrite(
    b: Builder, node: onnx.NodeProto, shapes: dict[str, list[int]], opset: int
) -> list[onnx.NodeProto]:
    """The nodes computing ``node`` (built into ``b``), or ``[]`` when it is left as it is."""
    model, shape = b.model, shapes.get(node.input[0], [])
    if node.op_type in ("Elu", "Selu", "Celu"):
        return _elu_like(b, node)
    if node.op_type == "PRelu":
        return _prelu(b, node)
    if node.op_type == "Softplus":
        return _softplus(b, node)
    if node.op_type in ("ReduceMax", "ReduceMin") and len(shape) >= 2 and min(shape[1:]) > 0:
        given = static_value(model, node.input[1]) if len(node.input) > 1 and node.input[1] else None
        axes = [
            int(a) % len(shape) for a in (given.reshape(-1) if given is not None else attr(node, "axes", []))
        ]
        if axes and 0 not in axes and sorted(axes) == list(range(min(axes), max(axes) + 1)):
            return _reduce_extreme(b, node, shape, sorted(axes))
    if node.op_type == "InstanceNormalization" and len(shape) >= 3:
        return _instance_norm(b, node, len(shape), opset)
    if node.op_type in ("DepthToSpace", "SpaceToDepth") and len(shape) == 4 and min(shape[1:]) > 0:
        return _depth_space(b, node, shape)
    if node.op_type == "Pad" and shape:
        raw = attr(node, "mode", b"constant")
        mode, pads = raw.decode() if isinstance(raw, bytes) else str(raw), _pads_of(model, node)
        extra = [i for i in node.input[2:] if i]  # constant value or axes: constant mode only
        rank = len(shape)
        if mode in ("reflect", "edge") and pads and len(pads) == 2 * rank and min(pads) >= 0 and not extra:
            padded = [a for a in range(rank) if pads[a] or pads[rank + a]]
            if all(shape[a] > max(pads[a], pads[rank + a]) for a in padded):  # static, large enough
                return _pad(b, node, shape, pads, mode)
    return []


DECOMPOSED = (
    "Elu",
    "Selu",
    "Celu",
    "PRelu",
    "Softplus",
    "ReduceMax",
    "ReduceMin",
    "InstanceNormalization",
    "DepthToSpace",
    "SpaceToDepth",
    "Pad",
)


def decompose_operators(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Rewrite the operators of ``DECOMPOSED`` that lie on the gradient path; return how many."""
    needs = downstream(model, set(trainable))
    todo = [
        i
        for i, n in enumerate(model.graph.node)
        if n.op_type in DECOMPOSED and any(x in needs for x in n.input)
    ]
    if not todo:
        return 0
    shapes = observed_shapes(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)

    def rewrite(node: onnx.NodeProto) -> Builder | None:
        b = Builder(model, node)
        return b if _rewrite(b, node, shapes, opset) and same_values(model, node, b, shapes) else None

    return apply_rewrites(model, todo, rewrite)
