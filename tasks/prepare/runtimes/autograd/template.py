"""The inference model the board writes its trained weights into, without onnx.

``inference_template.onnx`` is the model in eval mode (the TorchScript exporter, as the ORT path's
exports, BatchNorm kept apart from the convolutions so each parameter stays its own initializer)
with the recipe's inference outputs only, less its trainable tensors and the frozen ones another
file of the job holds (:mod:`.shared`). The board appends them to a copy, the trainable ones with
its trained values (:mod:`device_agent.runtimes.weights`); :func:`inference_of` does the same on
the host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx

from device_agent.runtimes.state import CheckpointState
from device_agent.runtimes.weights import STATE, assembled, left_out, shared_files
from tasks.errors import ArtifactError
from tasks.prepare.export.tracing import bags_as_embeddings, projected_lstms_unrolled, restored
from tasks.prepare.onnx_versions import OPSET
from tasks.prepare.runtimes.autograd.onnx_passes import unfused_pads_proto
from tasks.prepare.runtimes.autograd.onnx_step import Explain, exporting

# the eval-mode export's opsets: the ORT path's first; the next only for an operator that needs it
# (aten::col2im, F.fold, needs 18); the board's ONNX Runtime loads up to 21
OPSETS = (OPSET, 18)


def export_inference(model: Any, inputs: tuple[Any, ...], input_names: list[str], output_names: list[str],
                     path: Path, explain: Explain | None = None) -> None:  # fmt: skip
    """The TorchScript export of ``model`` in eval mode, every parameter and buffer an initializer of
    its own name, batch dynamic, at the first opset of :data:`OPSETS` that has its operators; a
    failure is ``explain``'s error (:func:`.onnx_step.exporting`); a pool after a zero Pad kept from
    ONNX Runtime's PadFusion (:func:`.onnx_passes.unfused_pads_proto`)."""
    for opset in OPSETS:
        try:
            _export(model, inputs, input_names, output_names, path, opset, explain)
            break
        except Exception as exc:  # exporting's error: ArtifactError or explain's
            if opset == OPSETS[-1] or "opset version" not in str(exc.__cause__ or exc):
                raise
    proto = onnx.load(str(path))  # the initializers out of the inputs again (see _export)
    inits = {i.name for i in proto.graph.initializer}
    kept = [i for i in proto.graph.input if i.name not in inits]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    unfused_pads_proto(proto)
    onnx.save(proto, str(path))


def _export(model: Any, inputs: tuple[Any, ...], input_names: list[str], output_names: list[str], path: Path,
            opset: int, explain: Explain | None) -> None:  # fmt: skip
    """One export. PRESERVE: no eval peephole, which would fold each BatchNorm into its convolution.
    Initializers as inputs: no deduplication, which makes a tensor equal to another at export (a
    fresh BatchNorm's running variance and its weight, all ones) an Identity of it, so training one
    would change the other."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    axes = {n: {0: "batch"} for n in [*input_names, *output_names]}
    # projected LSTMs: torch's exporter refuses them whole; bags: the same values as the ORT path exports
    with restored(model), projected_lstms_unrolled(model), bags_as_embeddings():
        model.eval()
        exporting("the inference model", lambda: torch.onnx.export(
            model, inputs, str(path), dynamo=False, training=torch.onnx.TrainingMode.PRESERVE,
            do_constant_folding=False, export_params=True, opset_version=opset, input_names=input_names,
            output_names=output_names, dynamic_axes=axes, keep_initializers_as_inputs=True), explain)  # fmt: skip


def reads(node: onnx.NodeProto) -> set[str]:
    """The names ``node`` reads: its inputs and, in the graphs of its attributes (an If's branches,
    a Loop's body, at any depth), every name they read, the outer scope's among them."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in graph.node:
                names |= reads(inner)
            names.update(o.name for o in graph.output)
    return names


def keep_outputs(model: onnx.ModelProto, outputs: list[str], *, inputs: bool = True) -> None:
    """Keep only ``outputs`` and what computes them (nodes, initializers, what the sub-graphs of a
    node among them read from outside, and the inputs unless ``inputs`` is False), in place."""
    graph = model.graph
    kept_outputs = [o for o in graph.output if o.name in outputs]
    del graph.output[:]
    graph.output.extend(kept_outputs)
    needed, nodes = set(outputs), []
    for node in reversed(graph.node):
        if needed & set(node.output):
            nodes.append(node)
            needed |= reads(node)
    del graph.node[:]
    graph.node.extend(reversed(nodes))
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    if inputs:
        kept_inputs = [i for i in graph.input if i.name in needed]
        del graph.input[:]
        graph.input.extend(kept_inputs)


def write_template(graph: onnx.ModelProto, outputs: list[str], trainable: list[str], path: Path) -> None:
    """Write ``path``, the inference template: a copy of the eval-mode export ``graph`` with
    ``outputs`` only (the ``trainable`` tensors and those other files hold are left out of it
    later: :mod:`.shared`); ArtifactError when a trainable tensor is not a float32 initializer of
    it (the board would write its trained values under a name the model does not read)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(graph)
    keep_outputs(proto, outputs)
    by_name = {i.name: i for i in proto.graph.initializer}
    missing = [n for n in trainable if n not in by_name or by_name[n].data_type != onnx.TensorProto.FLOAT]
    if missing:
        raise ArtifactError(f"inference template: trainable tensor {missing[0]!r} is no float32 initializer of the "
                            "exported inference model (the exporter renamed or folded it)")  # fmt: skip
    onnx.save(proto, str(path))


def inference_of(out_dir: Path, manifest: dict, checkpoint: Path, out: Path) -> Path:
    """The inference model of a checkpoint of the prepared folder ``out_dir`` (the prepared one, or
    a board's), written as the board writes it: the template with the checkpoint's tensors and the
    frozen ones it leaves out."""
    files = manifest["files"]
    step = out_dir / files["step"]["path"]
    spec = json.loads(step.read_text())
    state = CheckpointState.load_checkpoint(checkpoint)
    weights = {name: p.data for name, p in state.parameters}
    table = left_out(spec, "inference_template")
    wanted = [e[0] for e in table.get("tensors", []) if e[3] == STATE]
    missing = sorted(set(wanted) - set(weights))
    if missing:
        raise ArtifactError(f"{checkpoint}: no tensor {missing[0]!r} for the inference model")
    out.parent.mkdir(parents=True, exist_ok=True)
    template = out_dir / files["inference_template"]["path"]
    out.write_bytes(assembled(template, table, shared_files(step, spec), weights))
    return out
