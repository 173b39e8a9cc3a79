"""The node and constant makers of the losses built node by node as onnxblock Blocks (distillation,
segmentation, keypoints): each appends to the Block's graph under a name from onnxblock's own
generator, so several losses and their parts never clash."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

Const = Callable[..., str]  # const(value, dtype=np.float32) -> the initializer's name
Node = Callable[..., str]  # node(op, inputs, outputs=1, **attrs) -> the (first) output's name


def block_ops(graph: onnx.GraphProto, prefix: str) -> tuple[Const, Node]:
    """``const`` and ``node`` appending to ``graph``, their names starting with ``prefix``."""
    from onnxruntime.training.onnxblock import _graph_utils  # imports torch: only when graphs are generated

    name = _graph_utils.generate_graph_name

    def const(value: Any, dtype: Any = np.float32) -> str:
        n = name(f"{prefix}.const")
        graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), n))
        return n

    def node(op: str, inputs: list[str], outputs: int = 1, **attrs: Any) -> str:
        outs = [name(f"{prefix}.{op.lower()}") for _ in range(outputs)]
        graph.node.append(onnx.helper.make_node(op, inputs, outs, name=name(op), **attrs))
        return outs[0]

    return const, node
