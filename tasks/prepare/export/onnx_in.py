"""Transfer learning from an ONNX model the user did not train: load, convert, cut, add a head.

The models users have are model-zoo files, a colleague's export or an eval-mode export with
BatchNorm folded into the convolutions (the wiki's ``onnx::Conv_691`` names). :func:`adapt_onnx`
turns one into the ``model.onnx`` the artifact generation takes:

1. load it with its external-data files, check it (``onnx.checker``) and refuse an IR version
   the board's ONNX Runtime 1.19.2 cannot load;
2. convert its opset with onnx's version converter when it is outside 13-21 (ORT 1.19.2's
   training generates artifacts for 13-21 as they are: measured on mobilenet_v2);
3. cut it: ``model.cut_at`` tensors become the outputs and everything after them is dropped
   (``onnx.utils.Extractor``, onnx's own sub-graph extraction, shapes inferred first);
4. make every layer parameter an initializer the board trains and loads: float ``Constant``
   weights become initializers, float16/64 ones cast to float become float32, ``Identity`` nodes of
   weights go (:mod:`tasks.prepare.rewrites.param_chains`);
5. add the recipe's ``[head]``: global average pooling and flatten for a 4-D cut tensor, an
   optional hidden Linear + ReLU, then a Linear to ``num_classes`` (``Gemm`` nodes built with
   ``onnx.helper``), initialised as ``torch.nn.Linear`` is, from the head's seed;
6. give every graph input and output a symbolic batch axis, infer shapes and check the result.

Which parameters train is decided later on this graph (:mod:`tasks.prepare.trainable`,
``trainable.train_from`` among them). Every problem is one line naming the recipe field.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, version_converter

from tasks.errors import ModelError, RecipeError, ort_message
from tasks.prepare.feeds import graph_feeds
from tasks.prepare.messages import layer_of
from tasks.prepare.onnx_versions import extractor
from tasks.prepare.rewrites.param_chains import check_checkpoint_dtypes, fold_parameter_chains
from tasks.prepare.sandbox.ort_parent import RunFailed
from tasks.prepare.sandbox.probe_failures import init_failure_node, node_failure
from tasks.prepare.sandbox.supervise import run_graph
from tasks.recipe.extras import HeadSpec
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)

MIN_OPSET, MAX_OPSET, TARGET_OPSET = 13, 21, 17
MAX_IR = 10  # ORT 1.19.2 loads IR <= 10
BATCH = "batch"


def opset_of(model: onnx.ModelProto) -> int:
    """The default-domain opset a model imports."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def load_foreign(path: Path) -> onnx.ModelProto:
    """Load an ONNX file with its external data, checked; one-line errors for what a board cannot use."""
    if not path.is_file():
        raise RecipeError("model.onnx", "an existing ONNX file", str(path))
    try:
        model = onnx.load(str(path), load_external_data=True)
    except FileNotFoundError as exc:
        raise ModelError(
            f"model.onnx {path}: an external-data file it names is missing ({exc.filename}); keep the "
            "data files beside the model"
        ) from exc
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelError(
            f"model.onnx {path} is not a valid ONNX model (truncated or corrupt?): {exc}"
        ) from exc
    if model.ir_version > MAX_IR:
        raise ModelError(
            f"model.onnx {path} has IR version {model.ir_version}; ONNX Runtime 1.19.2 on the board loads "
            f"IR <= {MAX_IR} (save it with onnx 1.17, or onnx.version_converter to opset <= {MAX_OPSET})"
        )
    try:
        onnx.checker.check_model(model, full_check=False)
    except Exception as exc:
        raise ModelError(f"model.onnx {path} fails the ONNX checker: {str(exc).splitlines()[0]}") from exc
    return model


def convert_opset(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """The model at an opset the board's ORT trains (13-21): converted when outside that range."""
    opset = opset_of(model)
    if MIN_OPSET <= opset <= MAX_OPSET:
        return model
    target = TARGET_OPSET if opset < MIN_OPSET else MAX_OPSET
    try:
        converted = version_converter.convert_version(model, target)
        onnx.checker.check_model(converted)
    except Exception as exc:
        raise ModelError(
            f"{where}: opset {opset} is outside the {MIN_OPSET}-{MAX_OPSET} ONNX Runtime 1.19.2 trains, and "
            f"onnx's version converter cannot take it to {target}: {str(exc).splitlines()[0]}"
        ) from exc
    log.info("%s: converted from opset %d to %d", where, opset, target)
    return converted


def _tensor_names(model: onnx.ModelProto) -> list[str]:
    """Every value name in graph order: inputs, then each node's outputs."""
    names = [i.name for i in model.graph.input]
    for node in model.graph.node:
        names += [o for o in node.output if o]
    return names


def cut(model: onnx.ModelProto, tensors: tuple[str, ...]) -> onnx.ModelProto:
    """The sub-graph from the model's inputs to ``tensors`` (they become its outputs)."""
    known = _tensor_names(model)
    for name in tensors:
        if name not in known:
            near = ", ".join(repr(n) for n in known[-6:])
            raise RecipeError("model.cut_at", f"tensor names of the model (the last ones are {near})", name)
    inits = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in inits]
    try:
        return extractor(model).extract_model(inputs, list(tensors))
    except Exception as exc:
        raise ModelError(f"model.cut_at {list(tensors)}: onnx cannot extract that sub-graph: {exc}") from exc


def _shape(model: onnx.ModelProto, tensor: str) -> list[int | str | None]:
    inferred = onnx.shape_inference.infer_shapes(model)
    for vi in list(inferred.graph.output) + list(inferred.graph.value_info):
        if vi.name == tensor and vi.type.tensor_type.HasField("shape"):
            return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                    for d in vi.type.tensor_type.shape.dim]  # fmt: skip
    return []


def _linear(rng: np.random.Generator, fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights [out, in] and bias [out] as torch.nn.Linear initialises them: U(-1/sqrt(in), 1/sqrt(in))."""
    bound = 1.0 / np.sqrt(fan_in)
    weight = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
    return weight, rng.uniform(-bound, bound, fan_out).astype(np.float32)


def add_head(model: onnx.ModelProto, tensor: str, head: HeadSpec, output: str) -> onnx.ModelProto:
    """Append pooling/flatten, an optional hidden Linear + ReLU and a Linear to ``head.num_classes``
    after ``tensor``; the head's output ``output`` becomes the graph's only output."""
    shape = _shape(model, tensor)
    if len(shape) < 2:
        raise RecipeError(
            "head", f"a cut tensor with a batch axis and features; {tensor!r} has shape", shape or "unknown"
        )
    nodes, inits, x = [], [], tensor
    if len(shape) == 4 and head.pool == "auto":
        nodes.append(helper.make_node("GlobalAveragePool", [x], ["head/pool"], name="head/GlobalAveragePool"))
        x, features = "head/pool", shape[1]
    else:
        features = int(np.prod(shape[1:])) if all(isinstance(d, int) and d > 0 for d in shape[1:]) else None
    if not isinstance(features, int) or features <= 0:
        raise RecipeError(
            "head", f"a cut tensor whose feature size is known; {tensor!r} has shape {shape}", head.pool
        )
    nodes.append(helper.make_node("Flatten", [x], ["head/flat"], name="head/Flatten", axis=1))
    x = "head/flat"
    rng = np.random.default_rng(head.seed)
    layers = [("hidden", head.hidden)] if head.hidden else []
    layers.append(("out", head.num_classes))
    for i, (name, width) in enumerate(layers):
        weight, bias = _linear(rng, features, width)
        w, b = f"head.{name}.weight", f"head.{name}.bias"
        inits += [numpy_helper.from_array(weight, w), numpy_helper.from_array(bias, b)]
        last = i == len(layers) - 1
        y = output if last else f"head/{name}"
        nodes.append(helper.make_node("Gemm", [x, w, b], [y], name=f"head/{name}/Gemm", transB=1))
        if not last:
            nodes.append(helper.make_node("Relu", [y], [f"head/{name}/relu"], name=f"head/{name}/Relu"))
            y = f"head/{name}/relu"
        x, features = y, width
    graph = model.graph
    graph.node.extend(nodes)
    graph.initializer.extend(inits)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(output, TensorProto.FLOAT, [BATCH, head.num_classes]))
    return model


def dynamic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """Graph inputs and outputs with a symbolic first axis (an eval export often fixes it to 1)."""
    inits = {i.name for i in model.graph.initializer}
    for vi in [i for i in model.graph.input if i.name not in inits] + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_param = BATCH
    del model.graph.value_info[:]  # stale fixed-batch shapes; inferred again below
    return model


def check_batch_follows(model: onnx.ModelProto, name: str, batch: int = 2) -> None:
    """ModelError unless a batch of ``batch`` representative inputs (the recipe's data, zeros without
    any) runs and every output keeps that batch: an export with a fixed batch (the dynamo exporter
    without ``dynamic_shapes``) writes it into constant Reshape shapes, and the board would train it
    on batches it cannot take. The run is supervised (a crash is one line, not the end of odl)."""
    feeds = graph_feeds(model, batch)
    try:
        outs = run_graph(model, feeds, f"checking that a batch of {batch} runs through the graph")
        wrong = [o.shape for o in outs.values() if not o.shape or o.shape[0] != batch]
    except RunFailed as exc:
        if exc.phase == "load":  # an initialisation failure, named by its node
            node = init_failure_node(model)
            why = ort_message(exc.error).split("Exception during initialization:")[-1].strip()
            where = (
                f"node '{node.name}' ({node.op_type}, layer {layer_of(node.name)})"
                if node is not None
                else "it"
            )
            raise ModelError(
                f"model.onnx {name}: ONNX Runtime cannot initialise {where}: {why[:200]}"
            ) from exc
        wrong, reason = [], node_failure(exc.error) or ort_message(exc.error) or exc.error.splitlines()[0]
    else:
        reason = f"outputs of shapes {wrong}" if wrong else ""
    if reason:
        raise ModelError(
            f"model.onnx {name}: a batch of {batch} does not run through the graph ({reason[:200]}): its batch "
            "size is fixed inside it (a Reshape to a constant shape); export it with a dynamic batch axis "
            "(torch.onnx.export dynamic_axes, or dynamic_shapes with dynamo=True)"
        )


def adapt_onnx(recipe: Recipe, out: Path) -> Path:
    """Write the recipe's ONNX model, converted, cut and with its new head, to ``out`` (one file)."""
    src = Path(recipe.model.ref)
    model = convert_opset(load_foreign(src), f"model.onnx {src.name}")
    if recipe.model.cut_at:
        model = cut(model, recipe.model.cut_at)
    folded = fold_parameter_chains(model)
    check_checkpoint_dtypes(model, f"model.onnx {src.name}")
    if recipe.head is not None:
        model = add_head(model, recipe.model.cut_at[0], recipe.head, recipe.model.output_names[0])
    model = dynamic_batch(model)
    try:
        model = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ModelError(
            f"model.onnx {src.name} after the cut and head fails the ONNX checker: {exc}"
        ) from exc
    check_batch_follows(model, src.name)
    outputs = [o.name for o in model.graph.output]
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    log.info("adapted %s -> %s (opset %d, outputs %s; parameter chains: %s)", src.name, out, opset_of(model),
             outputs, ", ".join(f"{k} {v}" for k, v in folded.items()) or "none")  # fmt: skip
    return out
