"""Where a graph that kills ONNX Runtime dies: its node prefixes run in fresh children
(:class:`tasks.prepare.sandbox.ort_parent.Child`), bisecting for the first node whose run dies, within
``BISECT_BUDGET_S``, and the words that name that node, its layer and what to change.
"""

from __future__ import annotations

import signal
import time

import numpy as np
import onnx

from tasks.prepare.feeds import Feeds
from tasks.prepare.node_names import layer_of
from tasks.prepare.sandbox.ort_parent import Child, Died

BISECT_BUDGET_S = 120


def where_it_dies(model: onnx.ModelProto, feeds: Feeds, returncode: int) -> str:
    """The first node whose run dies, with its layer and what to do, or why none was found."""
    node, why = first_dying_node(model, feeds.arrays)
    return f"the first node whose run dies is {node_words(node, returncode)}" if node is not None else why


def node_words(node: onnx.NodeProto, returncode: int) -> str:
    """``'/loss/Div' (Div, layer loss): <what to change>`` for the node a run died in."""
    layer = layer_of(node.name)
    named = f"'{node.name}' ({node.op_type}" + (f", layer {layer})" if layer != node.name else ")")
    return f"{named}: {_advice(node, returncode)}"


def _advice(node: onnx.NodeProto, returncode: int) -> str:
    """What to change, from the signal and the operator."""
    if -returncode == signal.SIGFPE and node.op_type in ("Div", "Mod"):
        return ("its integer divisor is 0 for these inputs: keep what the model divides by at least 1 "
                "(e.g. clamp(min=1)) in its code")  # fmt: skip
    if -returncode == signal.SIGKILL:
        return "it needs more memory than this machine gives: lower training.batch_size or model.input_shape"
    return "the board's ONNX Runtime would die the same way on such inputs: change or replace that operation"


def prefix(model: onnx.ModelProto, count: int) -> onnx.ModelProto:
    """``model`` truncated after its first ``count`` nodes, each tensor they compute an output (so
    ONNX Runtime prunes none of them)."""
    part = onnx.ModelProto()
    part.CopyFrom(model)
    del part.graph.node[count:]
    del part.graph.output[:]
    part.graph.output.extend(
        onnx.helper.make_empty_tensor_value_info(o) for n in part.graph.node for o in n.output if o
    )
    return part


def first_dying_node(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], budget_s: float = BISECT_BUDGET_S
) -> tuple[onnx.NodeProto | None, str]:
    """Bisect the node prefixes of ``model`` in fresh children for the first node whose run dies:
    (that node, ""), or (None, why not) when the graph does not die run this way or time ran out."""
    count, deadline, child = len(model.graph.node), time.monotonic() + budget_s, Child()
    lo, hi = 0, count  # once the whole graph died: dies(hi) and not dies(lo)

    def dies(k: int) -> bool:
        try:
            child.ask({"model": prefix(model, k).SerializeToString(), "feeds": feeds, "outputs": None},
                      timeout=max(1.0, deadline - time.monotonic()))  # fmt: skip
        except Died:
            return True
        return False

    try:
        if not dies(count):
            return None, "the graph does not die when run alone node by node on these inputs"
        while hi - lo > 1:
            if time.monotonic() > deadline:
                return None, f"it dies within nodes {lo + 1}-{hi} (bisection stopped after {budget_s:.0f} s)"
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if dies(mid) else (mid, hi)
        return model.graph.node[hi - 1], ""
    except TimeoutError:
        return None, f"it dies within nodes {lo + 1}-{hi} (bisection stopped after {budget_s:.0f} s)"
    finally:
        child.stop()
