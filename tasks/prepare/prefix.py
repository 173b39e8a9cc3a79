"""Frozen-prefix caching, on the host: find where the frozen part of a model ends, split the model
there, and stitch the trained suffix back onto the prefix.

When every trainable parameter lies after one tensor (the *cut*) and the part before it is
deterministic (no active Dropout or random op, no BatchNorm on batch statistics), the board can
run that prefix once per sample, keep its output, and train only the suffix on it: the same
arithmetic as the full graph, without recomputing layers whose output never changes.

``find_cut`` picks the latest such tensor, ``split`` writes ``artifacts/split/`` (the prefix as a
forward-only model, the suffix's training artifacts) and ``stitch`` joins a trained suffix's
inference model to the prefix again (:func:`onnx.compose.merge_models`). Graph extraction uses
:class:`onnx.utils.Extractor` (the maintained ONNX tool) rather than hand-written surgery.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import compose, numpy_helper

from tasks.errors import ArtifactError
from tasks.prepare.onnx_versions import extractor

SPLIT_DIR = "artifacts/split"
RANDOM_OPS = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
}


@dataclass(frozen=True)
class Cut:
    """Where a model splits: the cut tensor, or why it cannot (``tensor`` None)."""

    tensor: str | None
    reason: str
    prefix_nodes: int = 0
    suffix_nodes: int = 0
    passthrough: tuple[str, ...] = ()  # model inputs only the suffix reads (an embedded loss's labels)


def _static(model: onnx.ModelProto) -> set[str]:
    """Tensors computed from initializers and constants only (shapes, folded constants)."""
    known = {i.name for i in model.graph.initializer} | {""}
    for node in model.graph.node:
        if all(i in known for i in node.input):
            known.update(node.output)
    return known


def _computable(model: onnx.ModelProto, sources: set[str]) -> set[str]:
    have = set(sources)
    for node in model.graph.node:
        if all(i in have for i in node.input):
            have.update(node.output)
    return have


def _reached(model: onnx.ModelProto, source: str) -> set[str]:
    """Tensors computed from ``source``."""
    have = {source}
    for node in model.graph.node:
        if any(i in have for i in node.input):
            have.update(node.output)
    return have


def _ancestors(model: onnx.ModelProto, tensor: str) -> list[onnx.NodeProto]:
    producer = {o: n for n in model.graph.node for o in n.output}
    todo, seen, nodes = [tensor], set(), []
    while todo:
        node = producer.get(todo.pop())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        todo.extend(node.input)
    return nodes


def _constant_value(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and name in node.output:
            return numpy_helper.to_array(node.attribute[0].t) if node.attribute[0].type == 4 else None
    return None


def _random_node(
    model: onnx.ModelProto, nodes: list[onnx.NodeProto], batchnorm: str
) -> tuple[onnx.NodeProto, str] | None:
    """The first node of ``nodes`` whose output is not a function of its input alone, and why."""
    for node in reversed(nodes):  # ancestors come nearest first: the earliest is last
        if node.op_type in RANDOM_OPS:
            return node, "draws random numbers"
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            mode = _constant_value(model, node.input[2])
            if mode is None or bool(mode):
                return node, "is active in training"
        if node.op_type == "BatchNormalization" and batchnorm != "frozen":
            return node, f"normalises with batch statistics (trainable.batchnorm = '{batchnorm}')"
    return None


def find_cut(model: onnx.ModelProto, trainable: list[str], batchnorm: str = "frozen") -> Cut:
    """The latest tensor after which every trainable parameter lies, if the prefix is deterministic."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in inits]
    tainted, static = set(trainable), _static(model)
    boundary: list[str] = []
    for node in model.graph.node:
        if any(i in tainted for i in node.input):
            tainted.update(node.output)
            boundary += [i for i in node.input if i not in tainted and i not in static and i not in boundary]
    if not boundary:
        return Cut(None, "no trainable parameter reaches an output")
    direct = tuple(b for b in boundary if b in inputs)
    outputs = {o.name for o in model.graph.output}
    for name in direct:  # labels may pass by the prefix to an embedded loss; the data input may not
        if outputs <= _reached(model, name):
            return Cut(None, f"a trainable parameter acts on the model input {name!r}: no frozen prefix")
    order = {o: k for k, n in enumerate(model.graph.node) for o in n.output}
    outputs = [o.name for o in model.graph.output]
    for cand in sorted(set(boundary) - set(direct), key=lambda b: -order.get(b, -1)):
        if all(o in _computable(model, static | {cand, *direct}) for o in outputs):
            return _deterministic(model, cand, direct, inputs, batchnorm)
    if not set(boundary) - set(direct):
        return Cut(None, f"a trainable parameter acts on the model input {direct[0]!r}: no frozen prefix")
    inner = [b for b in boundary if b not in direct]
    return Cut(
        None,
        f"the trainable part reads {len(inner)} tensors of the frozen part ({', '.join(inner[:3])}), not one",
    )


def extract(model: onnx.ModelProto, inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
    """The sub-model from ``inputs`` to ``outputs`` (shapes inferred, initializers kept by name)."""
    sub = extractor(model).extract_model(inputs, outputs)
    sub.ir_version, sub.producer_name = model.ir_version, "odl-prefix-split"
    del sub.opset_import[:]
    sub.opset_import.extend(model.opset_import)
    return sub


def split(model: onnx.ModelProto, cut: Cut) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(prefix, suffix) of ``model`` at ``cut``; the suffix's first input is the cut tensor, then
    the model inputs it reads directly (``cut.passthrough``)."""
    assert cut.tensor is not None
    reads = {i for n in _ancestors(model, cut.tensor) for i in n.input}
    inputs = [i.name for i in model.graph.input if i.name in reads]
    prefix = extract(model, inputs, [cut.tensor])
    suffix = extract(model, [cut.tensor, *cut.passthrough], [o.name for o in model.graph.output])
    batch_dim_symbolic(suffix.graph.input[0])
    return prefix, suffix


def batch_dim_symbolic(value: onnx.ValueInfoProto) -> None:
    """Make the first axis of ``value`` a symbol (``batch``) when the graph fixed it."""
    dims = value.type.tensor_type.shape.dim
    if dims and not dims[0].dim_param:
        dims[0].dim_param = "batch"


def stitch(prefix_path: Path, suffix_path: Path, out: Path) -> Path:
    """One inference model: the prefix followed by the trained suffix (exported by the board)."""
    prefix, suffix = onnx.load(str(prefix_path)), onnx.load(str(suffix_path))
    cut = prefix.graph.output[0].name
    if cut not in {i.name for i in suffix.graph.input}:
        raise ArtifactError(f"{suffix_path}: the trained suffix has no input {cut!r} to join the prefix at")
    suffix.ir_version = prefix.ir_version = max(prefix.ir_version, suffix.ir_version)
    for graph in (prefix.graph, suffix.graph):  # shape hints only; the cut's would appear twice
        keep = [v for v in graph.value_info if v.name != cut]
        del graph.value_info[:]
        graph.value_info.extend(keep)
    rename_shared(prefix.graph, suffix.graph, keep={cut})
    opsets = {o.domain: o.version for o in [*prefix.opset_import, *suffix.opset_import]}
    for m in (prefix, suffix):
        del m.opset_import[:]
        m.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in opsets.items())
    try:
        merged = compose.merge_models(prefix, suffix, io_map=[(cut, cut)])
        del merged.opset_import[:]  # merge_models lists each domain once per model
        merged.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in opsets.items())
        onnx.checker.check_model(merged)
    except Exception as exc:  # noqa: BLE001 - onnx raises ValueError, ValidationError ...
        raise ArtifactError(
            f"joining the prefix {prefix_path} and the trained suffix {suffix_path}: {str(exc).splitlines()[0]}"
        ) from exc
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    onnx.save(merged, str(tmp))
    tmp.replace(out)
    return out


def _names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor and node name a graph defines (initializers, node outputs, inputs, node names)."""
    return (
        {i.name for i in graph.initializer}
        | {o for n in graph.node for o in n.output if o}
        | {i.name for i in graph.input}
        | {n.name for n in graph.node if n.name}
    )


def rename_shared(prefix: onnx.GraphProto, suffix: onnx.GraphProto, keep: set[str]) -> int:
    """Rename in ``prefix`` every name ``suffix`` also defines, except ``keep`` (the cut).

    An exporter shares one initializer between layers when their values are equal (the zero biases
    of BatchNorms folded at their initial statistics, a constant used twice): extracted apart, both
    halves hold it, and ONNX's merge refuses repeated names. The prefix computes frozen values only,
    so its copies take a ``prefix/`` name and the trained suffix keeps the parameter names.
    """
    shared = (_names(prefix) & _names(suffix)) - keep - {i.name for i in prefix.input}
    if not shared:
        return 0
    new = {name: f"prefix/{name}" for name in shared}
    for init in prefix.initializer:
        init.name = new.get(init.name, init.name)
    for node in prefix.node:
        node.name = new.get(node.name, node.name)
        node.input[:] = [new.get(i, i) for i in node.input]
        node.output[:] = [new.get(o, o) for o in node.output]
    for value in prefix.value_info:
        value.name = new.get(value.name, value.name)
    return len(shared)


def _deterministic(
    model: onnx.ModelProto, cand: str, direct: tuple[str, ...], inputs: list[str], batchnorm: str
) -> Cut:
    """``cand``, or an earlier tensor when a random node lies before it (that node then runs in the
    suffix, at every step, as in the full graph)."""
    while True:
        prefix = _ancestors(model, cand)
        if {i for n in prefix for i in n.input} & set(direct):
            return Cut(None, f"a trainable parameter acts on the model input {direct[0]!r}: no frozen prefix")
        found = _random_node(model, prefix, batchnorm)
        if found is None:
            return Cut(cand, "", len(prefix), len(model.graph.node) - len(prefix), direct)
        node, why = found
        label = f"{node.op_type} {node.name or node.output[0]!r} before the trainable part {why}"
        outputs = [o.name for o in model.graph.output]
        earlier = node.input[0] if node.input and node.op_type not in RANDOM_OPS else None
        if earlier is None or earlier in inputs:
            return Cut(None, label)
        if not all(o in _computable(model, _static(model) | {earlier, *direct}) for o in outputs):
            return Cut(None, f"{label}, and no single tensor before it feeds the rest")
        cand = earlier
