"""Small helpers over ONNX graphs shared by the fix-ups and the BatchNorm rewrites: attributes,
constants, node replacement in topological order, reachability, inferred and observed shapes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tasks.prepare.feeds import graph_feeds
from tasks.prepare.sandbox.ort_parent import RunFailed
from tasks.prepare.sandbox.supervise import run_shapes
from tasks.quiet import ORT_CAUGHT


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


def bypass(model: onnx.ModelProto, drop: Callable[[onnx.NodeProto], bool]) -> int:
    """Remove the single-output nodes ``drop`` selects (it sees each node's inputs already renamed),
    each passing its first input on unchanged: their readers read that input instead. A graph
    output is never bypassed. Returns how many nodes went."""
    outputs = {o.name for o in model.graph.output}
    rename: dict[str, str] = {}
    kept = []
    for node in model.graph.node:
        node.input[:] = [rename.get(i, i) for i in node.input]
        if len(node.output) == 1 and node.output[0] not in outputs and drop(node):
            rename[node.output[0]] = node.input[0]
            continue
        kept.append(node)
    if rename:
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return len(rename)


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


def quiet_session(model: onnx.ModelProto):  # -> onnxruntime.InferenceSession
    """A CPU inference session of ``model`` that logs errors only: the pipeline's own small check
    graphs would otherwise print ORT's optimizer warnings into the user's terminal."""
    import onnxruntime  # heavy; loaded only when a graph is run on the host

    options = onnxruntime.SessionOptions()
    options.log_severity_level = ORT_CAUGHT
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def annotate_shapes(model: onnx.ModelProto) -> int:
    """Write every intermediate tensor's shape into the graph's value_info, as measured by running it
    at batch 2 and 3: a dimension that follows the batch is ``batch``, one that changes otherwise gets
    a name of its own, the rest are numbers. ORT's gradient kernels that size their result from the
    graph (MaxPoolGrad's channels and spatial size) read 0 for a dimension the exporter left unknown
    (after GroupNorm's Reshape to ``Shape(x)``); returns how many tensors were annotated."""
    two, three = observed_shapes(model, 2, dtypes=True), observed_shapes(model, 3, dtypes=True)
    inputs = {i.name for i in [*model.graph.input, *model.graph.output, *model.graph.initializer]}
    values = []
    for name, (shape, dtype) in two.items():
        other = three.get(name)
        if name in inputs or other is None or len(other[0]) != len(shape) or dtype is None:
            continue
        dims: list[int | str] = []
        for k, (a, b) in enumerate(zip(shape, other[0], strict=True)):
            dims.append(a if a == b else "batch" if (a, b) == (2, 3) else f"{name}_dim{k}")
        values.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), dims))
    if values:
        del model.graph.value_info[:]
        model.graph.value_info.extend(values)
    return len(values)


def observed_shapes(model: onnx.ModelProto, batch: int = 2, *, dtypes: bool = False) -> dict:
    """Shapes of every tensor as ONNX Runtime computes them on a batch of ``batch`` representative
    inputs (:func:`tasks.prepare.feeds.graph_feeds`: the recipe's data, zeros without any), in the
    stage's supervised child; the inferred ones (:func:`shapes_of`) where ONNX Runtime refuses the
    run. ``dtypes``: (shape, numpy dtype) of the computed tensors only. Exporters leave many shapes
    symbolic (``x.view(-1, C, 1, 1)``); a run knows them all. A run that kills ONNX Runtime stops
    preparation with the stage's one-line error."""
    shapes = shapes_of(model) if not dtypes else {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    names = [o for n in probe.graph.node for o in n.output if o and o not in known]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in names)
    what = f"measuring every tensor's shape at batch {batch}"
    try:
        values = run_shapes(probe, graph_feeds(model, batch), what)
    except RunFailed:  # a graph ONNX Runtime refuses to run keeps its inferred shapes
        return shapes
    for name, (shape, dtype) in values.items():
        shapes[name] = (shape, dtype) if dtypes else shape
    return shapes
