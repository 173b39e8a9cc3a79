"""Upsampling on the gradient path: ONNX Runtime 1.19.2 has no CPU kernel for ``ResizeGrad``.

A ``Resize`` of an ``[N, C, H, W]`` map in nearest, linear or cubic mode is separable and linear:
``y = A_h @ x @ A_w^T`` for two fixed matrices ``A_h`` (``Ho x H``) and ``A_w`` (``Wo x W``). Each
matrix is measured by running the node's own Resize (same mode, coordinate transformation, rounding
and scale along that axis) on one-hot inputs, so the rewrite means what the runtime means; it is
then two MatMuls, whose gradients ORT has, and is checked against the original node on random data
(a node whose output size the graph computes from other tensors' shapes at that measured size).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tasks.prepare.graph import quiet_session
from tasks.prepare.rewrites.rewrite_kit import Builder, rewrite_each, same_values, static_value

MODES = {"nearest", "linear", "cubic"}


def _axis_matrix(
    model: onnx.ModelProto, node: onnx.NodeProto, axis: int, size: int, out: int
) -> np.ndarray | None:
    """``A`` (``out x size``) of the node along spatial ``axis`` (2 or 3), from one-hot inputs."""

    shape = [size, 1, 1, 1]
    shape[axis] = size
    sizes = [size, 1, 1, 1]
    sizes[axis] = out
    basis = np.eye(size, dtype=np.float32).reshape(shape)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    probe = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)
    graph = helper.make_graph(
        [probe], "axis",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes")],
    )  # fmt: skip
    check = helper.make_model(graph, opset_imports=list(model.opset_import))
    check.ir_version = model.ir_version
    try:
        sess = quiet_session(check)
        y = sess.run(["y"], {"x": basis})[0]
    except Exception:  # noqa: BLE001 - a probe ORT refuses: the node stays
        return None
    return y.reshape(size, out).T.copy() if y.size == size * out else None


def _sizes(model: onnx.ModelProto, name: str) -> list[int] | None:
    """The output sizes a Resize is given: all four when static, else the spatial two when the
    exporter writes them as ``Concat(Shape(x)[:2], [Ho, Wo])`` (batch and channels kept)."""
    value = static_value(model, name)
    if value is not None:
        return [int(v) for v in value.reshape(-1)]
    node = next((n for n in model.graph.node if name in n.output), None)
    if node is None or node.op_type != "Concat":
        return None
    tail = static_value(model, node.input[-1])
    return [-1, -1, *(int(v) for v in tail.reshape(-1))] if tail is not None and tail.size == 2 else None


def _rewrite(model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, list[int]]) -> Builder | None:
    """The two-MatMul form of ``node``, checked, or None when it cannot be written so."""
    raw = dict((a.name, helper.get_attribute_value(a)) for a in node.attribute)
    mode = raw.get("mode", b"nearest")
    coords = raw.get("coordinate_transformation_mode", b"half_pixel")
    shape, out = shapes.get(node.input[0], []), shapes.get(node.output[0], [])
    if (mode.decode() if isinstance(mode, bytes) else mode) not in MODES or len(shape) != 4 or len(out) != 4:
        return None
    if (coords.decode() if isinstance(coords, bytes) else coords) == "tf_crop_and_resize" or raw.get("axes"):
        return None
    scales = static_value(model, node.input[2]) if len(node.input) > 2 and node.input[2] else None
    sizes = _sizes(model, node.input[3]) if len(node.input) > 3 and node.input[3] else None
    if scales is not None and scales.size == 4:
        if not np.allclose(scales[:2], 1.0):
            return None  # batch or channel resized: not a spatial upsampling
        out = [
            shape[0],
            shape[1],
            *(int(np.floor(d * f)) for d, f in zip(shape[2:], scales[2:], strict=True)),
        ]
    elif sizes is not None and len(sizes) == 4:
        out = [shape[0], shape[1] if sizes[1] < 0 else sizes[1], *sizes[2:]]
    if min(shape[1:] + out[1:]) <= 0 or shape[1] != out[1]:
        return None
    b = Builder(model, node)
    a_h = _axis_matrix(model, node, 2, shape[2], out[2])
    a_w = _axis_matrix(model, node, 3, shape[3], out[3])
    if a_h is None or a_w is None:
        return None
    rows = b.op("MatMul", [b.const("rows", a_h), node.input[0]])
    b.op("MatMul", [rows, b.const("columns_T", a_w.T.copy())], node.output[0])
    if scales is None and sizes is None:  # sizes from other tensors' shapes: checked at the measured size
        return b if same_values(*_measured_sizes(model, node, out), b, shapes) else None
    return b if same_values(model, node, b, shapes) else None


def _measured_sizes(
    model: onnx.ModelProto, node: onnx.NodeProto, out: list[int]
) -> tuple[onnx.ModelProto, onnx.NodeProto]:
    """``node`` reading its measured output size (at batch 2) from a constant, in a model that holds
    only that constant: the original a rewrite is checked against when the graph computes the size
    from other tensors' shapes (``F.interpolate(x, size=skip.shape[2:])``, as smp's U-Net decoder does;
    the recipe's input shape fixes them)."""
    name = f"{node.output[0]}__measured_sizes"
    held = onnx.ModelProto(ir_version=model.ir_version, opset_import=list(model.opset_import))
    held.graph.initializer.append(onnx.numpy_helper.from_array(np.array([2, *out[1:]], np.int64), name))
    fixed = onnx.NodeProto()
    fixed.CopyFrom(node)
    fixed.input[3] = name
    return held, fixed


def resizes_as_matmuls(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Rewrite every 2-D Resize whose input needs a gradient as two MatMuls; return how many."""
    return rewrite_each(model, {"Resize"}, _rewrite, trainable)
