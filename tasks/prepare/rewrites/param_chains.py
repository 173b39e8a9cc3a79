"""A layer's parameters as the board trains them: initializers read through chains of views.

Exporters do not always feed a Conv or Gemm its weight and bias directly: an ``Identity`` in front
of a bias (an eval-mode export that merged equal biases), a ``Cast`` of a float16 weight, a
``Reshape``/``Transpose``/``Squeeze``/``Unsqueeze``/``Flatten`` of a stored tensor, or the tensor
itself in a ``Constant`` node rather than an initializer. Selection follows those chains back to
the initializers (:func:`tasks.prepare.selection.weight_sources`), so a layer's bias trains with
its weight; this module makes what it finds trainable on the board:

- :func:`fold_parameter_chains` (ONNX-in, before anything else reads the graph) turns a float
  ``Constant`` feeding a layer's weight or bias into an initializer of the same name; converts a
  float16/bfloat16/float64 initializer to float32 when every use of it casts it to float (ORT
  1.19.2's training checkpoint cannot load float16 or bfloat16); gives each ``Identity`` of an
  initializer (parameters an exporter merged because their values were equal) an initializer of
  its own (:func:`split_shared_initializers`, also run on every exported model before selection);
  and drops every other ``Identity`` (and then no-op ``Cast``) of a constant tensor, its readers
  reading the tensor itself. What stays
  (views with ORT gradients: Reshape, Transpose, Squeeze, Unsqueeze, Flatten) trains as it is.
- :func:`check_checkpoint_dtypes` refuses in one line a float initializer the board could not load.
- :func:`check_partition` holds the trainable/frozen split to its promise: every float initializer
  a node reads is in one of the two sets, and a layer that trains reads no weight or bias from a
  ``Constant`` node (it would stay fixed while the rest of the layer trains).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tasks.errors import ModelError
from tasks.prepare.graph import attr, bypass
from tasks.prepare.selection import layer_params, weight_sources

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
UNLOADABLE = (TensorProto.FLOAT16, TensorProto.BFLOAT16)  # by ORT 1.19.2's load_checkpoint (measured)
VIEW_OPS = ("Identity", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Flatten")  # values unchanged
PARAM_SLOTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (0, 1)}


def _is_view(node: onnx.NodeProto | None, casts: bool = True) -> bool:
    """A node passing its first input's values on unchanged (a Cast between float types too)."""
    if node is None:
        return False
    return node.op_type in VIEW_OPS or (
        casts and node.op_type == "Cast" and attr(node, "to", 0) in FLOAT_TYPES
    )


def _origin(producer: dict[str, onnx.NodeProto], tensor: str, casts: bool = True) -> str:
    """The tensor ``tensor`` is a view of: followed back through view nodes' first input."""
    while _is_view(producer.get(tensor), casts):
        tensor = producer[tensor].input[0]
    return tensor


def parameter_slots(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """(layer, input tensor) of every weight or bias input of a Conv, ConvTranspose or Gemm, and of
    the constant operand of a MatMul whose other operand is data."""
    static = set(weight_sources(model, set())) | {""}
    slots = []
    for node in model.graph.node:
        inputs = [(k, name) for k, name in enumerate(node.input) if k in PARAM_SLOTS.get(node.op_type, ())]
        if node.op_type == "MatMul" and all(name in static for _, name in inputs):
            continue  # a product of two constants is no layer
        slots += [(node, name) for _, name in inputs if name and name in static]
    return slots


def _constant_tensor(node: onnx.NodeProto, name: str) -> onnx.TensorProto | None:
    """The float tensor a Constant node holds, as an initializer called ``name``, else None."""
    for a in node.attribute:
        if a.name == "value" and a.t.data_type in FLOAT_TYPES:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(a.t)
            tensor.name = name
            return tensor
        if a.name in ("value_float", "value_floats"):
            return numpy_helper.from_array(np.asarray(helper.get_attribute_value(a), np.float32), name)
    return None


def _as_float32(init: onnx.TensorProto) -> np.ndarray:
    """An initializer's values as float32 (bfloat16 is stored as a float32's upper 16 bits)."""
    values = numpy_helper.to_array(init)
    if init.data_type == TensorProto.BFLOAT16:
        return (values.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


def promote_constants(model: onnx.ModelProto) -> int:
    """Float Constant nodes feeding a layer's weight or bias become initializers of their name."""
    producer = {o: n for n in model.graph.node for o in n.output}
    values: dict[str, onnx.TensorProto] = {}
    for _, tensor in parameter_slots(model):
        origin = _origin(producer, tensor)
        node = producer.get(origin)
        value = _constant_tensor(node, origin) if node is not None and node.op_type == "Constant" else None
        if value is not None:
            values[origin] = value
    if values:
        kept = [n for n in model.graph.node if not (n.op_type == "Constant" and n.output[0] in values)]
        del model.graph.node[:]
        model.graph.node.extend(kept)
        model.graph.initializer.extend(values.values())
    return len(values)


def cast_params_to_float32(model: onnx.ModelProto) -> int:
    """Float16/bfloat16/64 initializers read only through views ending in Casts to float become float32;
    every Cast to float of a float32 constant then becomes an Identity. Returns the conversions."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    converted, stale = 0, set()
    for init in model.graph.initializer:
        if init.data_type not in FLOAT_TYPES or init.data_type == TensorProto.FLOAT:
            continue
        ends, views, todo = [], [], [init.name]
        while todo:
            for node in readers.get(todo.pop(), []):
                if _is_view(node, casts=False):
                    todo.append(node.output[0])
                    views.append(node.output[0])
                else:
                    ends.append(node)
        if ends and all(n.op_type == "Cast" and attr(n, "to", 0) == TensorProto.FLOAT for n in ends):
            init.CopyFrom(numpy_helper.from_array(_as_float32(init), init.name))
            converted += 1
            stale.update([init.name, *views])
    if stale:  # their inferred types were the old float type
        kept = [v for v in model.graph.value_info if v.name not in stale]
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept)
    producer = {o: n for n in model.graph.node for o in n.output}
    floats = {i.name for i in model.graph.initializer if i.data_type == TensorProto.FLOAT}
    for node in model.graph.node:
        if node.op_type == "Cast" and attr(node, "to", 0) == TensorProto.FLOAT:
            if _origin(producer, node.input[0], casts=False) in floats:
                node.op_type = "Identity"
                del node.attribute[:]
    return converted


def _subgraph_reads(model: onnx.ModelProto) -> set[str]:
    """Names read inside the graph attributes of nodes (If/Loop bodies): left as they are."""
    reads: set[str] = set()
    for node in model.graph.node:
        for a in node.attribute:
            for graph in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                reads.update(i for n in graph.node for i in n.input)
    return reads


def split_shared_initializers(model: onnx.ModelProto) -> int:
    """Each ``Identity`` of an initializer becomes an initializer of its own, named as its output
    and holding a copy of the values. The TorchScript exporter merges parameters that are equal
    when it exports (every fresh BatchNorm's weight of ones, bias of zeros) into one initializer
    read through an Identity per parameter, named as that parameter; training the merged one would
    tie layers PyTorch trains apart (and ORT 1.19.2 then defines one gradient twice: "Duplicate
    definition of name (conv2.bn.weight_grad)"). An initializer with one reader stays as it is.
    Returns how many initializers were made."""
    inits = {i.name: i for i in model.graph.initializer}
    outputs, keep = {o.name for o in model.graph.output}, _subgraph_reads(model)
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in set(node.input):
            readers[name] = readers.get(name, 0) + 1
    made: list[onnx.TensorProto] = []
    kept = []
    for node in model.graph.node:
        name = node.output[0] if node.op_type == "Identity" and len(node.output) == 1 else ""
        source = node.input[0] if node.op_type == "Identity" else ""
        shared = source in inits and readers[source] > 1  # one reader: a view, not a merge
        if shared and name not in outputs | keep | set(inits):
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[node.input[0]])
            copy.name = name
            made.append(copy)
            continue
        kept.append(node)
    if made:
        del model.graph.node[:]
        model.graph.node.extend(kept)
        model.graph.initializer.extend(made)
        used = {i for n in model.graph.node for i in n.input} | keep | outputs
        unused = [i for i in model.graph.initializer if i.name not in used]
        for init in unused:  # a merged initializer read only through the Identities now split
            model.graph.initializer.remove(init)
    return len(made)


def fold_identities(model: onnx.ModelProto) -> int:
    """Drop Identity nodes of constant tensors: their readers read the tensor itself."""
    static = set(weight_sources(model, set()))
    keep = _subgraph_reads(model)
    return bypass(
        model, lambda n: n.op_type == "Identity" and n.input[0] in static and n.output[0] not in keep
    )


def fold_parameter_chains(model: onnx.ModelProto) -> dict[str, int]:
    """Constants promoted, float initializers converted and Identities folded (see the module)."""
    counts = {
        "constants_promoted": promote_constants(model),
        "params_cast_to_float32": cast_params_to_float32(model),
        "shared_initializers_split": split_shared_initializers(model),
        "identities_folded": fold_identities(model),
    }
    return {k: v for k, v in counts.items() if v}


def _data_nodes(model: onnx.ModelProto, sources: dict[str, set[str]]) -> list[onnx.NodeProto]:
    """Nodes reading data (not only constants): the layers that use the parameters."""
    return [n for n in model.graph.node if not all(i in sources or i == "" for i in n.input)]


def _layer(node: onnx.NodeProto) -> str:
    """A layer as its node: name (the output's when unnamed) and operator."""
    return f"'{node.name or node.output[0]}' ({node.op_type})"


def _reader_layer(model: onnx.ModelProto, name: str) -> str:
    """The first layer reading ``name``, directly or through constant-only nodes."""
    sources = weight_sources(model, {name})
    node = next((n for n in _data_nodes(model, sources) if name in layer_params(n, sources)), None)
    return _layer(node) if node is not None else "none"


def check_checkpoint_dtypes(model: onnx.ModelProto, where: str) -> None:
    """ModelError naming a float16 or bfloat16 initializer left after folding: ORT 1.19.2's
    training checkpoint, which holds every trainable and frozen parameter, cannot load one
    ("Unsupported data type"; float64 loads)."""
    for init in model.graph.initializer:
        if init.data_type in UNLOADABLE:
            kind = TensorProto.DataType.Name(init.data_type).lower()
            raise ModelError(
                f"{where}: initializer '{init.name}' of layer {_reader_layer(model, init.name)} is {kind}, and "
                f"ONNX Runtime 1.19.2's training checkpoint cannot hold {kind} parameters (one is converted to "
                "float32 when every use casts it to float): save the model in float32"
            )


def check_partition(model: onnx.ModelProto, trainable: list[str], frozen: list[str]) -> None:
    """ModelError when a float initializer some node reads is neither trainable nor frozen, or a
    layer with trainable parameters reads a weight or bias from a Constant node, not an initializer."""
    floats = {i.name for i in model.graph.initializer if i.data_type in FLOAT_TYPES}
    chosen, known = set(trainable), set(trainable) | set(frozen)
    sources = weight_sources(model, floats)
    for node in _data_nodes(model, sources):
        missing = [p for p in layer_params(node, sources) if p not in known]
        if missing:
            raise ModelError(
                f"parameter '{missing[0]}' of layer {_layer(node)} is in neither the trainable nor the frozen set"
            )
    for node, tensor in parameter_slots(model):
        own = layer_params(node, sources)
        if not sources.get(tensor) and chosen.intersection(own):
            raise ModelError(
                f"layer {_layer(node)} trains {own[0]!r} but reads "
                f"'{tensor}' from Constant nodes, not from an initializer: it would stay fixed while the "
                "layer trains; make it a parameter (an initializer, in PyTorch an nn.Parameter or a buffer)"
            )
