"""BatchNormalization in training graphs: the load fix every export needs, frozen running
statistics (the default, ``trainable.batchnorm = "frozen"``), and the layers left stale when ORT's
batch statistics are kept (``"batch-stats"``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tasks.prepare.graph import add_const, attr, drop_unused_initializers, rebuild, shapes_of


def fix_batchnorm(model: onnx.ModelProto) -> int:
    """Set ``training_mode=0`` (opset 14 and later; before it, the extra outputs alone meant
    training) and keep only the first output on every BatchNormalization node."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    count = 0
    for node in model.graph.node:
        if node.op_type != "BatchNormalization":
            continue
        kept = [a for a in node.attribute if a.name != "training_mode"]
        del node.attribute[:]
        node.attribute.extend(
            [*kept, *([onnx.helper.make_attribute("training_mode", 0)] if opset >= 14 else [])]
        )
        del node.output[1:]
        count += 1
    return count


def batchnorm_after_trainable(model: onnx.ModelProto, trainable: list[str]) -> list[str]:
    """Names of BatchNormalization nodes whose input depends on a trainable parameter.

    ONNX Runtime's on-device training normalises with batch statistics but never updates the
    running mean/variance, so in eval mode (and after export) these layers keep the statistics
    of the base model while the layers feeding them change.
    """
    affected = set(trainable)
    stale = []
    for node in model.graph.node:  # ONNX graphs are topologically sorted
        if any(i in affected for i in node.input):
            if node.op_type == "BatchNormalization" and node.input[0] in affected:
                stale.append(node.name or node.output[0])
            affected.update(node.output)
    return stale


def freeze_batchnorm(model: onnx.ModelProto, trainable: list[str]) -> int:
    """Rewrite every BatchNormalization as ``x * s + t`` from its running statistics.

    ``s = scale / sqrt(var + eps)`` and ``t = bias - mean * s`` become frozen constants. When the
    trainable set holds the node's scale or bias, they stay parameters of the same names:
    ``(x * inv_std + (-mean * inv_std)) * scale + bias`` with both reshaped to broadcast.
    """
    inits = {i.name: i for i in model.graph.initializer}
    shapes = None
    replace = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type != "BatchNormalization" or not all(n in inits for n in node.input[1:5]):
            continue
        shapes = shapes or shapes_of(model)
        rank = len(shapes.get(node.input[0], []))
        if rank < 2:  # rank unknown: broadcasting the statistics would be a guess, keep the node
            continue
        scale, bias, mean, var = (numpy_helper.to_array(inits[n]).astype(np.float64) for n in node.input[1:5])
        inv = 1.0 / np.sqrt(var + float(attr(node, "epsilon", 1e-5)))
        bshape = (-1, *([1] * (rank - 2)))
        p, x = node.name or node.output[0], node.input[0]
        if not {node.input[1], node.input[2]} & set(trainable):
            s = add_const(model, f"{p}/frozen_scale", (scale * inv).astype(np.float32).reshape(bshape))
            t = add_const(
                model, f"{p}/frozen_shift", (bias - mean * scale * inv).astype(np.float32).reshape(bshape)
            )
            replace[i] = [
                helper.make_node("Mul", [x, s], [f"{p}/scaled"], name=f"{p}/Mul"),
                helper.make_node("Add", [f"{p}/scaled", t], [node.output[0]], name=f"{p}/Add"),
            ]
            continue
        s = add_const(model, f"{p}/frozen_inv_std", inv.astype(np.float32).reshape(bshape))
        t = add_const(model, f"{p}/frozen_neg_mean_inv_std", (-mean * inv).astype(np.float32).reshape(bshape))
        shape = add_const(model, f"{p}/affine_shape", np.array(bshape, np.int64))
        replace[i] = [
            helper.make_node("Mul", [x, s], [f"{p}/normed0"], name=f"{p}/Mul_norm"),
            helper.make_node("Add", [f"{p}/normed0", t], [f"{p}/normed"], name=f"{p}/Add_norm"),
            helper.make_node("Reshape", [node.input[1], shape], [f"{p}/scale"], name=f"{p}/Reshape_scale"),
            helper.make_node("Reshape", [node.input[2], shape], [f"{p}/bias"], name=f"{p}/Reshape_bias"),
            helper.make_node("Mul", [f"{p}/normed", f"{p}/scale"], [f"{p}/scaled"], name=f"{p}/Mul"),
            helper.make_node("Add", [f"{p}/scaled", f"{p}/bias"], [node.output[0]], name=f"{p}/Add"),
        ]
    rebuild(model, replace)
    drop_unused_initializers(model)
    return len(replace)
