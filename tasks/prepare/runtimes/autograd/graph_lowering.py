"""An exported step graph made ready for :mod:`.onnx_grad`, and what is known of its tensors.

A training-mode BatchNorm becomes the operators that compute it (a board's inference build has no
training-mode BatchNorm); a MaxPool also gives the flat index of each maximum, which its gradient
scatters to (random operators become noise inputs in :mod:`.graph_noise`). Every tensor's shape
and type are seen by running the forward at two batch sizes: a size that differs depends on the
batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from tasks.prepare.runtimes.autograd.onnx_grad import Unsupported, attr
from tasks.prepare.runtimes.autograd.onnx_grad_nn import tiling
from tasks.quiet import ORT_CAUGHT

Shapes = dict[str, list[Any]]


def session(graph: Any, what: str, optimize: bool = True) -> Any:
    """An ONNX Runtime session of ``graph`` on one thread (its graph optimisations off for a probe
    run once)."""
    import onnxruntime  # the inference build's API, as the board's

    options = onnxruntime.SessionOptions()
    options.log_severity_level = ORT_CAUGHT
    # one thread: these runs are a few samples, and a pool's threads spinning between operators
    # (a Scan's per-step ones most) stall a preparation on a busy 2-core host for seconds
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return onnxruntime.InferenceSession(
            graph.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # ONNX Runtime raises its own types; the traced path may still do
        raise Unsupported(f"{what} does not load in ONNX Runtime: {str(exc)[:200]}") from exc


def run(sess: Any, arrays: list[np.ndarray], what: str) -> list[np.ndarray]:
    """``sess`` run on ``arrays`` (its inputs in order)."""
    try:
        names = [i.name for i in sess.get_inputs()]
        return sess.run(None, dict(zip(names, arrays, strict=True)))
    except Exception as exc:  # ONNX Runtime raises its own types; the traced path may still do
        raise Unsupported(f"{what} does not run in ONNX Runtime: {str(exc)[:200]}") from exc


def lower_batchnorms(graph: Any) -> None:
    """Each training-mode BatchNormalization as the operators computing it; each MaxPool with its
    indices as a second output; a pool of one-element windows as the strided Slice it is."""
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in _inferred(graph)}
    out = []
    for node in graph.graph.node:
        if _unit_window(node):
            out += _strided_slice(node)
            continue
        if node.op_type == "MaxPool" and len(node.output) == 1 and not tiling(node):
            node.output.append(f"{node.output[0]}/indices")
        if node.op_type == "BatchNormalization" and attr(node, "training_mode", 0):
            out += _batchnorm_nodes(node, ranks.get(node.input[0], 0))
        else:
            out.append(node)
    del graph.graph.node[:]
    graph.graph.node.extend(out)


def _unit_window(node: Any) -> bool:
    """An AveragePool or MaxPool (values only) of 1-element windows without padding: ``AvgPool2d(1,
    stride=2)``, a downsampling shortcut. ONNX Runtime fuses a zero Pad before it into the pool's
    pads, which its pool then refuses ('Pad should be smaller than kernel'): the step did not load."""
    if node.op_type not in ("AveragePool", "MaxPool") or len([o for o in node.output if o]) != 1:
        return False
    kernel = attr(node, "kernel_shape", [])
    return bool(kernel) and all(k == 1 for k in kernel) and not any(attr(node, "pads", []))


def _strided_slice(node: Any) -> list[Any]:
    """``node`` (see :func:`_unit_window`) as a Slice taking every ``stride``-th element of each
    spatial axis: ceil(L / stride) of them, as the pool gives with or without ``ceil_mode``."""
    spatial = len(attr(node, "kernel_shape", []))
    strides = list(attr(node, "strides", []) or [1] * spatial)
    p, make = f"{node.output[0]}/unit", helper.make_node

    def ints(name: str, values: list[int]) -> Any:
        return make(
            "Constant",
            [],
            [f"{p}/{name}"],
            value=helper.make_tensor("", TensorProto.INT64, [spatial], values),
        )

    return [ints("starts", [0] * spatial), ints("ends", [2**62] * spatial), ints("axes", list(range(2, 2 + spatial))),
            ints("steps", strides),
            make("Slice", [node.input[0], *(f"{p}/{k}" for k in ("starts", "ends", "axes", "steps"))], [node.output[0]],
                 name=node.name)]  # fmt: skip


def _inferred(graph: Any) -> list[Any]:
    inferred = onnx.shape_inference.infer_shapes(graph).graph
    return [v for v in [*inferred.input, *inferred.value_info] if v.type.tensor_type.HasField("shape")]


def _batchnorm_nodes(node: Any, rank: int) -> list[Any]:
    if rank < 2:
        raise Unsupported("a BatchNormalization of unknown rank")
    x, scale, bias = node.input[:3]
    axes, per = [0, *range(2, rank)], list(range(1, rank - 1))
    p, eps, make = f"{node.output[0]}/bn", attr(node, "epsilon", 1e-5), helper.make_node
    return [make("ReduceMean", [x], [f"{p}/mean"], axes=axes, keepdims=1),
            make("Sub", [x, f"{p}/mean"], [f"{p}/d"]),
            make("Mul", [f"{p}/d", f"{p}/d"], [f"{p}/d2"]),
            make("ReduceMean", [f"{p}/d2"], [f"{p}/var"], axes=axes, keepdims=1),
            make("Constant", [], [f"{p}/eps"], value=helper.make_tensor("", TensorProto.FLOAT, [], [eps])),
            make("Add", [f"{p}/var", f"{p}/eps"], [f"{p}/ve"]),
            make("Sqrt", [f"{p}/ve"], [f"{p}/std"]),
            make("Div", [f"{p}/d", f"{p}/std"], [f"{p}/xhat"]),
            make("Constant", [], [f"{p}/axes"], value=helper.make_tensor("", TensorProto.INT64, [len(per)], per)),
            make("Unsqueeze", [scale, f"{p}/axes"], [f"{p}/scale"]),
            make("Unsqueeze", [bias, f"{p}/axes"], [f"{p}/bias"]),
            make("Mul", [f"{p}/xhat", f"{p}/scale"], [f"{p}/scaled"]),
            make("Add", [f"{p}/scaled", f"{p}/bias"], [node.output[0]])]  # fmt: skip


def observed(
    graph: Any, arrays: list[np.ndarray], batched: set[int]
) -> tuple[Shapes, dict[str, int], dict[str, np.ndarray]]:
    """Every tensor's shape and element type, seen by running the forward (each Dropout as the
    identity) at batches 2 and 3 (``batched``: the indices of the arrays with a batch axis), and
    the values of the small integer tensors equal at both (the starts of a Slice, say)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(graph)
    for node in probe.graph.node:
        if node.op_type == "Dropout":
            node.op_type, node.input[:], node.output[:] = "Identity", node.input[:1], node.output[:1]
    known = {o.name for o in probe.graph.output} | {i.name for i in probe.graph.input}
    extra = [o for n in probe.graph.node for o in n.output if o and o not in known]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in extra)
    names = [o.name for o in probe.graph.output] + [i.name for i in probe.graph.input]
    runs, sess = [], session(probe, "the forward", optimize=False)
    for size in (2, 3):
        sized = [a[np.arange(size) % len(a)] if i in batched else a for i, a in enumerate(arrays)]
        runs.append(run(sess, sized, "the forward") + sized)
    shapes = {n: [_dim(d, e) for d, e in zip(a.shape, c.shape, strict=True)]
              for n, a, c in zip(names, *runs, strict=True) if a.ndim == c.ndim}  # fmt: skip
    types = {n: helper.np_dtype_to_tensor_dtype(a.dtype) for n, a in zip(names, runs[0], strict=True)}
    values = {n: a for n, a, c in zip(names, *runs, strict=True)
              if a.dtype.kind in "iu" and a.size <= 64 and a.shape == c.shape and np.array_equal(a, c)}  # fmt: skip
    return shapes, types, values


def _dim(at2: int, at3: int) -> int | str:
    """An axis seen at batches 2 and 3: its size, ``batch``, or ``batch*k`` (k rows per sample: a
    transformer's patches folded into the batch)."""
    if at2 == at3:
        return at2
    if at2 * 3 == at3 * 2 and at2 % 2 == 0 and at2 > 2:
        return f"batch*{at2 // 2}"
    return "batch"


def pruned(graph: Any) -> None:
    """Take out the nodes whose outputs nothing reads and the initializers no node reads (ONNX
    Runtime warns of each unused initializer when a session loads the graph)."""
    wanted = {o.name for o in graph.graph.output}
    keep = []
    for node in reversed(graph.graph.node):
        if any(o in wanted for o in node.output if o):
            keep.append(node)
            wanted.update(i for i in node.input if i)
    del graph.graph.node[:]
    graph.graph.node.extend(reversed(keep))
    used = [i for i in graph.graph.initializer if i.name in wanted]
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(used)


def fold_ifs(graph: Any, arrays: list[np.ndarray], batched: set[int]) -> None:
    """Each If whose condition is the same at batches 2 and 3 (a test of weights' shapes, as the
    exporter writes ``tile`` of a parameter) replaced by the nodes of the branch it takes, in place;
    Unsupported for one whose branch depends on the batch."""
    for _ in range(4):  # an If inside a taken branch is folded on the next pass
        ifs = [n for n in graph.graph.node if n.op_type == "If"]
        if not ifs:
            return
        probe = onnx.ModelProto()
        probe.CopyFrom(graph)
        del probe.graph.output[:]
        probe.graph.output.extend(helper.make_empty_tensor_value_info(n.input[0]) for n in ifs)
        pruned(probe)
        sess = session(probe, "the branches' conditions", optimize=False)
        taken = []
        for size in (2, 3):
            sized = [a[np.arange(size) % len(a)] if i in batched else a for i, a in enumerate(arrays)]
            taken.append([bool(np.asarray(c).all()) for c in run(sess, sized, "the branches' conditions")])
        if taken[0] != taken[1]:
            raise Unsupported("an If whose branch depends on the batch size")
        out = []
        for node in graph.graph.node:
            if node.op_type != "If":
                out.append(node)
                continue
            chosen = "then_branch" if taken[0].pop(0) else "else_branch"
            branch = next(a.g for a in node.attribute if a.name == chosen)
            out.extend(_inlined(graph, node, branch))
        del graph.graph.node[:]
        graph.graph.node.extend(out)
    raise Unsupported("If nodes nested deeper than four")


def _inlined(graph: Any, node: Any, branch: Any) -> list[Any]:
    """The nodes of ``branch`` with their own tensors renamed under the If's name, then an Identity
    from each branch output to the If's output; its initializers moved to ``graph``."""
    inner = {o for n in branch.node for o in n.output if o} | {i.name for i in branch.initializer}
    renamed = {t: f"{node.name or node.output[0]}/{t}" for t in inner}
    for init in branch.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = renamed[init.name]
        graph.graph.initializer.append(copy)
    nodes = []
    for inner_node in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner_node)
        copy.input[:] = [renamed.get(i, i) for i in copy.input]
        copy.output[:] = [renamed.get(o, o) for o in copy.output]
        copy.name = f"{node.name}/{copy.name}"
        nodes.append(copy)
    nodes += [helper.make_node("Identity", [renamed.get(o.name, o.name)], [y], name=f"{node.name}/out{k}")
              for k, (o, y) in enumerate(zip(branch.output, node.output, strict=True))]  # fmt: skip
    return nodes
