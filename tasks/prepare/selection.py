"""Which layers a strategy trains, found in the graph: the main path, the last feature layer and
the suffix that fits a budget.

The *main path* runs back from the classifier through the tensors that carry the features. At an
element-wise node with inputs of different sizes (a broadcast gate or bias) it follows the largest
input only, and at ``x * gate(x)`` (a squeeze-excitation block, even when the map is 1x1) the input
the other is computed from: the gate is not the features. Every other node is followed through all its inputs (both arms of a
residual Add, every part of a dense Concat, both operands of attention's MatMul).

``last-conv+classifier`` trains the classifier and the *last feature layer* before it: the weighted
layer (Conv, ConvTranspose, Gemm or MatMul with a parameter, a recurrent LSTM, GRU or RNN, or an
embedding: a Gather on axis 0 of a parameter indexed by a model input) on the main path, deepest
from the inputs (shapes measured by running the graph once), whose output still has more than one
position per sample (pixels, tokens or time steps: a rank of 3 or more). In a CNN that is the last
convolution of the last block; in a transformer stage the last linear layer over its tokens; in a
sequence model the last recurrent layer (uni- or bidirectional, its last stacked layer); in a bag
of embeddings (token ids embedded and pooled) the embedding table; never a squeeze-excitation gate,
a stem far from the head or a flattened ``Linear`` of a multi-layer classifier.

``suffix`` trains everything after one cut: the earliest tensor on the main path that alone
separates the inputs from the outputs and leaves at most the budget (``max_params`` or
``max_fraction`` of the model's parameters) after it. It is exactly what the frozen-prefix cache
skips on the board.
"""

from __future__ import annotations

from collections import deque

import onnx

from tasks.errors import RecipeError
from tasks.prepare.graph import observed_shapes

RECURRENT = ("LSTM", "GRU", "RNN")  # a recurrent layer's output Y is [seq, directions, batch, hidden]
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul", *RECURRENT)
ELEMENTWISE = ("Mul", "Add", "Sub", "Div", "Where", "Pow")


def _per_sample(shape: list[int]) -> int:
    """Elements per sample of a static shape (unknown dimensions count as 1)."""
    out = 1
    for d in shape[1:]:
        out *= max(d, 1)
    return out


def weight_sources(model: onnx.ModelProto, params: set[str] | dict[str, int]) -> dict[str, set[str]]:
    """For each tensor computed from initializers alone (a weight, ``Transpose(weight)`` of a
    ``Linear`` over tokens, a reshaped scale), the parameters it is computed from."""
    inits = {i.name for i in model.graph.initializer}
    out: dict[str, set[str]] = {name: ({name} if name in params else set()) for name in inits}
    for node in model.graph.node:
        if all(i in out or i == "" for i in node.input):
            sources = set().union(*(out.get(i, set()) for i in node.input))
            out.update({o: sources for o in node.output})
    return out


def layer_params(node: onnx.NodeProto, sources: dict[str, set[str]]) -> list[str]:
    """The parameters a node reads, directly or through weight-only nodes, in input order."""
    return list(dict.fromkeys(p for i in node.input for p in sorted(sources.get(i, ()))))


def _derives(producer: dict[str, onnx.NodeProto], tensor: str, source: str) -> bool:
    """True when ``tensor`` is computed from ``source``."""
    todo, seen = [tensor], set()
    while todo:
        name = todo.pop()
        if name == source:
            return True
        node = producer.get(name)
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            todo.extend(node.input)
    return False


def main_path(
    model: onnx.ModelProto,
    start: onnx.NodeProto,
    params: set[str],
    shapes: dict[str, list[int]] | None = None,
) -> list[onnx.NodeProto]:
    """Nodes on the main path behind ``start`` (itself excluded), nearest first."""
    shapes = shapes if shapes is not None else observed_shapes(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    weights = weight_sources(model, params)
    queue, seen, out = deque([start]), {id(start)}, []
    while queue:
        node = queue.popleft()
        data = [i for i in node.input if i in producer and i not in weights]
        if node.op_type in ELEMENTWISE and len(data) > 1:
            sizes = {i: _per_sample(shapes.get(i, [])) for i in data}
            data = [i for i in data if sizes[i] == max(sizes.values())]
        if node.op_type == "Mul" and len(data) == 2:  # x * gate(x): the gate is computed from x
            gates = [b for a, b in (data, data[::-1]) if _derives(producer, b, a)]
            data = [i for i in data if i not in gates] or data
        for name in data:
            prev = producer[name]
            if id(prev) not in seen:
                seen.add(id(prev))
                out.append(prev)
                queue.append(prev)
    return out


def is_embedding(node: onnx.NodeProto, sources: dict[str, set[str]], inputs: set[str]) -> bool:
    """True for ``nn.Embedding`` as exported: a Gather on axis 0 of a parameter, indexed by a model
    input (token ids), not by positions computed in the graph."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    return (
        node.op_type == "Gather"
        and axis == 0
        and bool(sources.get(node.input[0]))
        and node.input[1] in inputs
    )


def last_feature_layer(
    model: onnx.ModelProto, classifier: onnx.NodeProto, params: set[str]
) -> onnx.NodeProto | None:
    """The deepest weighted layer on the main path before ``classifier`` whose output has more than
    one position per sample (depth: the longest chain of nodes from the inputs, so the main arm of a
    residual block wins over its shortcut projection; graph order breaks ties); None when none."""
    shapes, sources = observed_shapes(model), weight_sources(model, params)
    depth: dict[str, tuple[int, int]] = {}
    for k, node in enumerate(model.graph.node):
        d = 1 + max((depth[i][0] for i in node.input if i in depth), default=0)
        depth.update({o: (d, k) for o in node.output})
    inputs = {i.name for i in model.graph.input}
    layers = [
        n for n in main_path(model, classifier, params, shapes)
        if (n.op_type in WEIGHTED or is_embedding(n, sources, inputs)) and layer_params(n, sources)
        and len(shapes.get(n.output[0], [])) >= 3
    ]  # fmt: skip
    return max(layers, key=lambda n: depth[n.output[0]]) if layers else None


def params_after(
    model: onnx.ModelProto, seeds: set[str], sources: dict[str, set[str]], start: str | None = None
) -> list[str]:
    """Parameters read only by nodes computed from the tensors ``seeds`` or by the node named
    ``start`` (graph order is topological). A tensor an exporter shares with a node before them
    (equal initializers merged into one) belongs to the frozen part too, and stays frozen."""
    reached, chosen, before = set(seeds), [], set()
    for node in model.graph.node:
        if any(i in reached for i in node.input) or (start is not None and node.name == start):
            reached.update(node.output)
            chosen += layer_params(node, sources)
        elif not all(i in sources or i == "" for i in node.input):  # a data node before the seeds
            before.update(layer_params(node, sources))
    return [p for p in dict.fromkeys(chosen) if p not in before]


def _separates(model: onnx.ModelProto, tensor: str, static: set[str]) -> bool:
    """True when every output can be computed from ``tensor`` and constants alone."""
    have = static | {tensor}
    for node in model.graph.node:
        if all(i in have for i in node.input):
            have.update(node.output)
    return all(o.name in have for o in model.graph.output)


def suffix_cut(
    model: onnx.ModelProto, params: dict[str, int], budget: int, classifier: onnx.NodeProto
) -> tuple[str, list[str]]:
    """(cut tensor, parameters after it) of the largest suffix within ``budget`` parameters."""
    inits = {i.name for i in model.graph.initializer}
    static = set(weight_sources(model, params)) | {""}  # tensors computed from constants alone
    order = {o: k for k, n in enumerate(model.graph.node) for o in n.output}
    candidates = {o for n in [classifier, *main_path(model, classifier, set(params))] for o in n.output}
    candidates |= {i.name for i in model.graph.input if i.name not in inits}  # the whole model
    order |= {name: -1 for name in candidates - set(order)}
    sources = weight_sources(model, params)
    best: tuple[str, list[str]] | None = None
    for tensor in sorted(candidates - static, key=lambda t: -order[t]):  # latest first: smallest suffix
        after = params_after(model, {tensor}, sources)
        if sum(params[p] for p in after) > budget:
            break
        if after and _separates(model, tensor, static):
            best = (tensor, after)
    if best is None:
        raise RecipeError(
            "trainable.max_params",
            "a budget that holds at least the classifier "
            f"({sum(params[p] for p in layer_params(classifier, weight_sources(model, params)))} parameters)",
            budget,
        )
    return best
