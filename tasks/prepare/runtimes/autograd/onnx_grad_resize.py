"""The gradient rule of ONNX's Resize for :mod:`.onnx_grad`: along each of the last two axes a resize
(nearest, linear or cubic alike) is a fixed linear map, whose matrix is read once by resizing the unit
vectors in ONNX Runtime; the gradient is the two matrices' transposes applied to the output gradient."""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.prepare.runtimes.autograd.onnx_grad import Builder, Unsupported, rule
from tasks.quiet import ort_session

G = list[str | None]


@rule("Resize")
def _resize(b: Builder, node: Any, gy: G) -> G:
    """A resize of the last two axes is a fixed linear map along each (nearest, linear or cubic
    alike): each map's matrix is read by resizing the unit vectors once here, and the gradient is
    the two matrices' transposes applied to the output gradient."""
    x, y = node.input[0], node.output[0]
    if len(b.shape(x)) != 4:
        raise Unsupported("a Resize of a tensor that is not 4-D")
    shape, out = [0, *b.static(x, [1, 2, 3])], [0, *b.static(y, [1, 2, 3])]
    if shape[1] != out[1]:
        raise Unsupported("a Resize of other axes than the last two of a 4-D tensor")
    mats = [_resize_matrix(node, b, axis, shape[axis], out[axis]) for axis in (2, 3)]  # [out, in] each
    g = b.op("MatMul", gy[0], b.const(mats[1]))  # [N, C, Ho, Wo] x [Wo, Wi]
    return [b.op("MatMul", b.const(mats[0].T), g), None, None, None]  # [Hi, Ho] x [N, C, Ho, Wi]


def _resize_matrix(node: Any, b: Builder, axis: int, size: int, out: int) -> np.ndarray:
    """[out, size]: the node's linear map along ``axis``, read by resizing each unit vector through
    ONNX Runtime (the other axis of size 1)."""
    from onnx import TensorProto, helper

    basis = np.zeros([size, 1, size, 1] if axis == 2 else [size, 1, 1, size], dtype=np.float32)
    basis[np.arange(size), 0, *((np.arange(size), 0) if axis == 2 else (0, np.arange(size)))] = 1.0
    inputs = ["x", "", "", "sizes"]
    sizes = np.array([size, 1, out, 1] if axis == 2 else [size, 1, 1, out], dtype=np.int64)
    scales = None
    if (
        len(node.input) > 2
        and node.input[2]
        and node.input[2] in b.constants
        and b.constants[node.input[2]].size
    ):
        given = b.constants[node.input[2]].astype(np.float32)
        scales = np.array(
            [1.0, 1.0, given[2] if axis == 2 else 1.0, given[3] if axis == 3 else 1.0], np.float32
        )
        inputs = ["x", "", "scales"]
    probe = helper.make_node(
        "Resize", inputs, ["y"], **{a.name: helper.get_attribute_value(a) for a in node.attribute}
    )
    inits = [helper.make_tensor("sizes", TensorProto.INT64, [4], sizes)] if scales is None else \
        [helper.make_tensor("scales", TensorProto.FLOAT, [4], scales)]  # fmt: skip
    graph = helper.make_graph([probe], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(basis.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    got = ort_session(model.SerializeToString(), threads=1).run(None, {"x": basis})[0]
    line = got[:, 0, :, 0] if axis == 2 else got[:, 0, 0, :]  # [size, out]
    if line.shape != (size, out):
        raise Unsupported("a Resize whose size along one axis depends on the other")
    return line.T.copy()
