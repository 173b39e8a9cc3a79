"""Find parameters in an exported ONNX graph: trainable sets by name, pattern and strategy.

Strategies walk the graph back from its outputs through producers (breadth first), never by
exporter-generated names: ``classifier`` is the first Gemm, MatMul(+Add) or Conv with weights
reached (a convolutional classifier such as SqueezeNet's ends in a Conv), and
``last-conv+classifier`` adds the last feature layer on the main path before the classifier (in a
CNN its last convolution, in a sequence model its last LSTM/GRU; :mod:`tasks.prepare.selection`) together with the scale and bias of a
BatchNormalization that directly follows it (an exporter that folds BN into the conv gives that
conv a bias: the same parameters, as the wiki's ``onnx::Conv_691/692``); ``suffix`` everything
after the earliest single cut that leaves at most ``max_params`` (or ``max_fraction``) to train.
"""

from __future__ import annotations

import fnmatch
from collections import deque
from collections.abc import Iterator
from math import prod

import onnx

from tasks.errors import RecipeError
from tasks.prepare.export.buffers import torch_buffers, torch_parameter_count
from tasks.prepare.rewrites.param_chains import FLOAT_TYPES, check_partition
from tasks.prepare.rewrites.recurrent import check_recurrent
from tasks.prepare.selection import last_feature_layer, layer_params, params_after, suffix_cut, weight_sources
from tasks.recipe.schema import Recipe
from tasks.recipe.training import TrainableSpec


def float_params(model: onnx.ModelProto) -> dict[str, int]:
    """Float initializers of the graph with their element counts."""
    return {i.name: prod(i.dims) for i in model.graph.initializer if i.data_type in FLOAT_TYPES}


def bn_statistics(model: onnx.ModelProto) -> set[str]:
    """Names of BatchNormalization running means and variances (never trainable)."""
    return {name for n in model.graph.node if n.op_type == "BatchNormalization" for name in n.input[3:5]}


def parameters(model: onnx.ModelProto) -> dict[str, int]:
    """The float initializers a strategy may train, with their element counts: neither BatchNorm
    running statistics nor a PyTorch model's registered buffers (:mod:`tasks.prepare.export.buffers`)."""
    frozen = bn_statistics(model) | torch_buffers(model)
    return {k: v for k, v in float_params(model).items() if k not in frozen}


def model_parameter_count(model: onnx.ModelProto) -> int:
    """The model's parameter count as its PyTorch model states it (buffers excluded), else the
    elements of :func:`parameters`."""
    count = torch_parameter_count(model)
    return count if count is not None else sum(parameters(model).values())


def _walk_back(model: onnx.ModelProto, start: list[str]) -> Iterator[onnx.NodeProto]:
    """Nodes reached from the tensors ``start`` through their producers, nearest first."""
    producer = {out: node for node in model.graph.node for out in node.output}
    queue, seen = deque(start), set()
    while queue:
        node = producer.get(queue.popleft())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        queue.extend(node.input)


def find_classifier(model: onnx.ModelProto, params: dict[str, int]) -> tuple[list[str], onnx.NodeProto]:
    """Parameters of the last Gemm / MatMul(+Add bias) / Conv before the outputs, and its node; a
    parameter counts when the node reads it directly or through weight-only nodes (an Identity,
    Cast or Reshape of it, :func:`tasks.prepare.selection.weight_sources`)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    sources = weight_sources(model, params)
    for node in _walk_back(model, [o.name for o in model.graph.output]):
        own = layer_params(node, sources)
        if node.op_type in ("Gemm", "MatMul", "Conv") and own:
            return own, node
        if node.op_type == "Add" and own:
            mm = next(
                (producer[i] for i in node.input if i in producer and producer[i].op_type == "MatMul"), None
            )
            if mm is not None and layer_params(mm, sources):
                return layer_params(mm, sources) + own, mm
    raise RecipeError(
        "trainable.strategy",
        "a model whose outputs come from a Gemm, MatMul or Conv layer with weights (strategy 'classifier')",
        "no such layer found walking back from the outputs",
    )


def find_last_conv(model: onnx.ModelProto, params: dict[str, int], start: onnx.NodeProto) -> list[str]:
    """Parameters of the last feature layer before ``start`` (the classifier) on the main path,
    with those of a BatchNormalization directly after it (:func:`tasks.prepare.selection.last_feature_layer`).
    """
    node = last_feature_layer(model, start, set(params))
    if node is None:
        raise RecipeError(
            "trainable.strategy",
            "a model with a convolution, a recurrent layer (LSTM, GRU), a linear layer over tokens or "
            "an embedding before its classifier (strategy 'last-conv+classifier'; for another model "
            "strategy 'classifier', 'suffix' or 'all')",
            "none on the path to the classifier",
        )
    bn = [n for n in model.graph.node if n.op_type == "BatchNormalization" and n.input[0] == node.output[0]]
    sources = weight_sources(model, params)
    return layer_params(node, sources) + [
        p for n in bn[:1] for i in n.input[1:3] for p in sorted(sources.get(i, ()))
    ]


def _by_strategy(model: onnx.ModelProto, spec: TrainableSpec, params: dict[str, int]) -> list[str]:
    strategy = spec.strategy
    if strategy == "all":
        return list(params)
    if strategy == "freeze_net":  # the ST script's freeze_net: backbone and extras frozen
        return _by_patterns(spec.heads, params, "trainable.heads")
    if strategy == "freeze_basenet":  # the ST script's freeze_base_net: only the backbone frozen
        backbone = set(_by_patterns(spec.backbone, params, "trainable.backbone"))
        return [n for n in params if n not in backbone]
    names, node = find_classifier(model, params)
    if strategy == "suffix":
        total = sum(params.values())
        budget = spec.max_params if spec.max_params is not None else int(spec.max_fraction * total)
        return suffix_cut(model, params, budget, node)[1]
    if strategy == "last-conv+classifier":
        names = find_last_conv(model, params, node) + names
    return names


def _by_patterns(
    patterns: tuple[str, ...],
    params: dict[str, int],
    field: str = "trainable.patterns",
    buffers: frozenset[str] | set[str] = frozenset(),
) -> list[str]:
    out = []
    for pattern in patterns:
        hits = fnmatch.filter(params, pattern)
        if not hits:
            held = fnmatch.filter(sorted(buffers), pattern)
            why = (
                f"it matches only registered buffers ({', '.join(held[:3])}), which never train; "
                if held
                else ""
            )
            raise RecipeError(
                field,
                f"a pattern matching at least one parameter ({why}some are: {list(params)[:6]})",
                pattern,
            )
        out += hits
    return out


def _not_a_parameter(name: str, stats: set[str], buffers: set[str]) -> str:
    """Why ``name`` of ``trainable.names`` cannot train, said to the user."""
    if name in stats:
        return "BatchNorm running statistics cannot be trained"
    if name in buffers:
        return (
            f"'{name}' is a registered buffer of the model (torch's named_buffers: a constant such as a "
            "filterbank or a table), not a parameter: buffers never train"
        )
    return "no such parameter"


def after(model: onnx.ModelProto, start: str, params: dict[str, int]) -> list[str]:
    """Parameters of every node from ``start`` (a node name or a tensor) to the outputs."""
    node_by_name = {n.name: n for n in model.graph.node if n.name}
    if start in node_by_name:
        seeds, first = set(node_by_name[start].output), [node_by_name[start]]
    elif any(start in n.output for n in model.graph.node) or start in {i.name for i in model.graph.input}:
        seeds, first = {start}, []
    else:
        some = [n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")][-4:]
        raise RecipeError(
            "trainable.train_from",
            f"a node or tensor name of the model after the cut (some nodes: {some})",
            start,
        )
    sources = weight_sources(model, params)
    return params_after(model, seeds, sources, first[0].name if first else None)


def resolve_trainable(
    recipe: Recipe, model: onnx.ModelProto, *, ort_limits: bool = True
) -> tuple[list[str], list[str], dict[str, int]]:
    """(trainable names, frozen names, element counts of every float parameter) for the recipe;
    ``ort_limits``: also refuse what ONNX Runtime 1.19.2's gradients cannot do (the autograd runtime
    differentiates with PyTorch and passes False)."""
    stats, buffers = bn_statistics(model), torch_buffers(model)
    counts, params = float_params(model), parameters(model)
    spec = recipe.trainable
    chosen = _by_strategy(model, spec, params) if spec.strategy else []
    chosen += _by_patterns(spec.patterns, params, buffers=buffers)
    for name in spec.names:
        if name not in params:
            why = _not_a_parameter(name, stats, buffers)
            raise RecipeError(
                "trainable.names",
                f"parameter names of the exported model ({why}; some are: {list(params)[:6]})",
                name,
            )
        chosen.append(name)
    if spec.train_from is not None:  # nothing before it trains; alone, everything after it does
        later = after(model, spec.train_from, params)
        chosen = [n for n in chosen if n in set(later)] if chosen else later
        if not chosen:
            raise RecipeError(
                "trainable.train_from",
                "a point with trainable parameters after it (the strategy, names and patterns chosen "
                "lie before it)",
                spec.train_from,
            )
    trainable = list(dict.fromkeys(chosen))
    frozen = [n for n in counts if n not in set(trainable)]
    check_partition(model, trainable, frozen)
    if ort_limits:
        check_recurrent(model, trainable, params)
    return trainable, frozen, counts
