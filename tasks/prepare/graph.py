"""Small helpers over ONNX graphs shared by the fix-ups and the BatchNorm rewrites: attributes,
constants, node replacement in topological order, reachability and inferred shapes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def attr(node: onnx.NodeProto, name: str, default: object) -> object:
    """The value of a node attribute, or ``default``."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def add_const(model: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    """Add ``value`` as an initializer called ``name``; return the name."""
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def rebuild(model: onnx.ModelProto, replace: dict[int, list[onnx.NodeProto]]) -> None:
    """Replace nodes by index with node lists, keeping the topological order."""
    nodes = [n for i, old in enumerate(model.graph.node) for n in replace.get(i, [old])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def downstream(model: onnx.ModelProto, sources: set[str]) -> set[str]:
    """Tensors computed from any of ``sources`` (ONNX graphs are topologically sorted)."""
    reached = set(sources)
    for node in model.graph.node:
        if any(i in reached for i in node.input):
            reached.update(o for o in node.output if o)
    return reached


def shapes_of(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Inferred shapes of every tensor (-1 for a dimension that is not static)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    values = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    out = {
        v.name: [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
        for v in values
    }
    out.update({i.name: list(i.dims) for i in model.graph.initializer})
    return out


def drop_unused_initializers(model: onnx.ModelProto) -> int:
    """Remove initializers no node reads (a rewritten BatchNorm's statistics, say)."""
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [i for i in model.graph.initializer if i.name in used]
    dropped = len(model.graph.initializer) - len(keep)
    if dropped:
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
    return dropped
