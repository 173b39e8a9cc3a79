"""The PyTorch twin of an ONNX model (``[model] onnx``) whose train step the autograd runtime derives.

``model.onnx`` is the adapted graph (:func:`tasks.prepare.export.onnx_in.adapt_onnx`), exactly the
ORT path's: the user's nodes, names and BatchNorm statistics, cut and given the recipe's head. The
steps need a ``torch.nn.Module`` that computes the same; onnx2torch (a maintained converter) makes
one: a ``torch.fx.GraphModule`` with one submodule per ONNX node.

Which torch tensor holds which initializer is read from the conversion itself (:func:`tensor_names`),
never from values: each submodule carries its node's ``onnx_mapping`` (the inputs it is called with);
the node's other initializer inputs became the submodule's own tensors in the node's input order
(Conv's W, B; BatchNormalization's scale, B, mean, var; Gemm's B, C), and an initializer passed as an
argument is a buffer of the ``initializers`` container that a ``get_attr`` node reads (one buffer per
use, so a shared initializer has several torch names, whose gradients autograd sums). Each pair is
then checked to hold the same values: a converter that stores a tensor transformed (a Gemm with
``transB=0`` keeps its weight transposed) gives no pair, and training such a tensor is one line.

onnx2torch 1.5.15 has no converters for the opset-18 reductions, whose ``axes`` became an input
(the dynamo exporter's files are opset 18): :func:`_register_reductions` adds them for constant axes,
through its own ``add_converter``; and it refuses the ``allowzero=1`` the dynamo exporter puts on
every Reshape, which :func:`_copy` drops where the constant shape has no 0 (where it changes nothing).
A Reshape whose shape the graph computes from a ``Shape`` is given the constant shape ONNX Runtime
measures, its batch axis -1 (:func:`batch_reshapes`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from tasks.errors import ModelError, RecipeError
from tasks.prepare.graph import observed_shapes

REDUCTIONS = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
              "ReduceLogSumExp", "ReduceSumSquare")  # fmt: skip


def torch_twin(graph: onnx.ModelProto, trainable: list[str]) -> tuple[Any, dict[str, list[str]]]:
    """The eval-mode torch module of ``graph`` and, for each of ``trainable``, the names of the torch
    tensors that hold it, one per read (RecipeError for one that some read holds transformed or not at
    all)."""
    import onnx2torch  # heavy (imports torch): only when an ONNX model trains under autograd

    _register_reductions()
    try:
        module = onnx2torch.convert(_copy(graph), attach_onnx_mapping=True)
    except Exception as exc:  # noqa: BLE001 - the converter raises NotImplementedError, KeyError, ...
        text = str(exc).strip().splitlines()
        raise ModelError(f"model.onnx: onnx2torch cannot make the PyTorch twin the autograd runtime differentiates: "
                         f"{type(exc).__name__}: {text[0][:200] if text else ''} (training.runtime = "
                         "'ort-training' trains the ONNX graph itself)") from exc  # fmt: skip
    names = tensor_names(module, graph)
    constant_reshapes(module)
    reads = [name for node in graph.graph.node for name in node.input]
    for name in trainable:  # every read held as it is, else the twin would train some reads only
        if len(names.get(name, [])) != reads.count(name):
            raise RecipeError("trainable", "tensors the autograd runtime's PyTorch twin of the ONNX model holds as "
                              "they are (onnx2torch stores this one transformed or not at all: leave it frozen, or "
                              "use training.runtime = 'ort-training')", name)  # fmt: skip
    return module.eval(), {n: names[n] for n in trainable}


def graph_named(recipe: Any, graph: onnx.ModelProto) -> Any:
    """``recipe`` with ``model.output_names`` as an ONNX model's adapted ``graph`` names its outputs
    (the ORT path's manifest names them so too): a file kept without a ``[head]`` keeps its own."""
    names = tuple(o.name for o in graph.graph.output)
    if recipe.model.kind != "onnx" or names == tuple(recipe.model.output_names):
        return recipe
    return dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, output_names=names))


def tensor_names(module: Any, graph: onnx.ModelProto) -> dict[str, list[str]]:
    """``{initializer: [torch tensor names]}`` of onnx2torch's ``module`` converted from ``graph``,
    from each submodule's node inputs (see the module docstring), each pair checked by value."""
    import torch  # heavy: only when an ONNX model trains under autograd

    inits = {i.name: i for i in graph.graph.initializer}
    producer = {out: node for node in graph.graph.node for out in node.output if out}
    pairs: list[tuple[str, str]] = []
    for call in module.graph.nodes:
        if call.op != "call_module":
            continue
        sub = module.get_submodule(call.target)
        mapping = getattr(sub, "onnx_mapping", None)
        node = producer.get(mapping.outputs[0]) if mapping is not None and mapping.outputs else None
        if node is None:
            continue
        for name, arg in zip(mapping.inputs, call.args, strict=False):
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr" and name in inits:
                pairs.append((name, str(arg.target)))
        own = [i for i in node.input if i in inits and i not in mapping.inputs]
        tensors = [
            n
            for n, _ in [*sub.named_parameters(), *sub.named_buffers()]
            if not n.endswith("num_batches_tracked")
        ]
        if len(own) == len(tensors):
            pairs += [(o, f"{call.target}.{t}") for o, t in zip(own, tensors, strict=True)]
    held = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    names: dict[str, list[str]] = {}
    for onnx_name, torch_name in pairs:
        value = torch.from_numpy(numpy_helper.to_array(inits[onnx_name]).copy())
        if torch_name in held and torch.equal(held[torch_name].detach(), value):
            names.setdefault(onnx_name, []).append(torch_name)
    return names


def constant_reshapes(module: Any) -> int:
    """Each onnx2torch Reshape of a constant shape without 0 made ``torch.reshape`` of that shape, in
    place; how many. Its module reads the shape tensor's values (``torch.any(shape == 0)``), which
    ``torch.export`` cannot trace with a symbolic batch (a guard on data)."""
    import torch  # heavy: only when an ONNX model trains under autograd
    from onnx2torch.node_converters.reshape import OnnxReshape  # the converter's own module

    done = 0
    for call in list(module.graph.nodes):
        if call.op != "call_module" or not isinstance(module.get_submodule(call.target), OnnxReshape):
            continue
        shape = call.args[1] if len(call.args) > 1 else None
        if not (isinstance(shape, torch.fx.Node) and shape.op == "get_attr"):
            continue
        dims = [int(d) for d in module.get_buffer(str(shape.target)).tolist()]
        if 0 in dims:
            continue
        with module.graph.inserting_before(call):
            reshaped = module.graph.call_function(torch.reshape, (call.args[0], tuple(dims)))
        call.replace_all_uses_with(reshaped)
        module.graph.erase_node(call)
        done += 1
    if done:
        module.graph.eliminate_dead_code()
        module.delete_all_unused_submodules()
        module.recompile()
    return done


def _register_reductions() -> None:
    """onnx2torch converters for the opset-18 reductions with constant ``axes`` (once per process)."""
    from onnx2torch.node_converters.reduce import OnnxReduceStaticAxes  # the converter's own module
    from onnx2torch.node_converters.registry import add_converter
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult, get_const_value

    def convert(node: Any, graph: Any) -> Any:
        if node.attributes.get("noop_with_empty_axes", 0):
            raise NotImplementedError(f"{node.operation_type} with noop_with_empty_axes")
        axes = None
        if len(node.input_values) > 1 and node.input_values[1]:  # KeyError for axes computed in the graph
            axes = get_const_value(node.input_values[1], graph).tolist()
        module = OnnxReduceStaticAxes(node.operation_type, axes, node.attributes.get("keepdims", 1))
        return OperationConverterResult(
            module, OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values)
        )

    for op in REDUCTIONS:
        try:
            add_converter(operation_type=op, version=18)(convert)
        except ValueError:  # "already registered": by an earlier call, or by onnx2torch itself
            continue


def _copy(graph: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``graph`` for the converter (which edits the model it is given), each Reshape whose
    constant shape has no 0 without ``allowzero`` (the attribute changes nothing there; onnx2torch
    refuses ``allowzero=1``, which the dynamo exporter writes on every Reshape)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(graph)
    inits = {i.name: i for i in copy.graph.initializer}
    for node in copy.graph.node:
        shape = inits.get(node.input[1]) if node.op_type == "Reshape" and len(node.input) > 1 else None
        if shape is not None and 0 not in numpy_helper.to_array(shape).tolist():
            kept = [a for a in node.attribute if a.name != "allowzero"]
            del node.attribute[:]
            node.attribute.extend(kept)
    batch_reshapes(copy)
    return copy


def batch_reshapes(model: onnx.ModelProto) -> int:
    """Each Reshape whose shape the graph computes from a ``Shape`` (``x.view(x.size(0), -1)`` in a
    TorchScript export) given the constant shape ONNX Runtime measures on batches of 2 and 3, its batch
    axis -1, when only that axis follows the batch; the shape's computation goes (in place; how many).
    The converter computes such a shape as tensors whose values ``torch.export`` cannot trace with a
    symbolic batch."""
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    computed = [
        n
        for n in model.graph.node
        if n.op_type == "Reshape" and len(n.input) > 1 and n.input[1] not in consts
    ]
    if not computed:
        return 0
    two, three = observed_shapes(model, 2), observed_shapes(model, 3)
    done = 0
    for node in computed:
        a, b = list(two.get(node.output[0]) or []), list(three.get(node.output[0]) or [])
        if len(a) != len(b) or not all(isinstance(d, int) for d in a + b):
            continue
        if [(x, y) for x, y in zip(a, b, strict=True) if x != y] != [(2, 3)]:
            continue  # some axis other than the batch changes with it, or none does
        dims = [-1 if x != y else x for x, y in zip(a, b, strict=True)]
        name = f"{node.output[0]}/batch_shape"
        model.graph.initializer.append(numpy_helper.from_array(np.array(dims, dtype=np.int64), name))
        node.input[1] = name
        done += 1
    if done:  # the nodes that computed those shapes go (onnx2torch converts no If or Loop)
        needed, kept = {o.name for o in model.graph.output}, []
        for node in reversed(model.graph.node):
            if needed & set(node.output):
                kept.append(node)
                needed |= set(node.input)
        del model.graph.node[:]
        model.graph.node.extend(reversed(kept))
    return done
