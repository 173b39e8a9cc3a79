"""The eval step of a PyTorch model from its inference export: ``model.onnx`` (the model in eval
mode, already exported) followed by the loss, exported alone on the model's outputs. The model is
traced once for inference and once for the train step, as the ORT path traces it once: a second
trace of the whole model in eval mode cost as much as the first (2-9 s on a transformer).

The joined graph is checked like every step: run once in ONNX Runtime and compared with PyTorch's
loss on the model's own eval-mode outputs. A graph it cannot join (a loss that does not export, a
random operator left in eval mode) is :class:`~.onnx_grad.Unsupported`, and the caller exports the
eval step the other way (:func:`.graph_step.graph_step`).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from tasks.prepare.export.torchscript import quiet_output
from tasks.prepare.onnx_versions import check_board_loadable
from tasks.prepare.prefix import RANDOM_OPS
from tasks.prepare.runtimes.autograd.graph_lowering import fold_ifs, pruned, run, session
from tasks.prepare.runtimes.autograd.onnx_grad import Unsupported
from tasks.prepare.runtimes.autograd.onnx_step import RTOL, relative
from tasks.prepare.runtimes.autograd.trace import StepInputs

OUT = "model_output."  # the model's outputs, renamed where the loss reads them
SCOPE = "/m"  # the train step's export holds the model as ``m``: the same tensors, the same names


def eval_step(inference: onnx.ModelProto, step: StepInputs, model_out: list[Any], outputs: list[str],
              path: Path) -> float:  # fmt: skip
    """Write the eval step (inputs: the feeds then the trainable tensors; outputs: ``outputs``,
    ``loss`` first) from ``inference`` and the loss; its largest relative difference from PyTorch's
    loss on ``model_out``, the model's eval-mode outputs on the step's batch."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    graph = onnx.ModelProto()
    graph.CopyFrom(inference)
    if len(graph.graph.output) != len(model_out):
        raise Unsupported("the inference export's outputs are not the model's")
    labels = step.feeds[step.model_inputs :]
    with torch.no_grad():
        loss, kept = step.loss(tuple(model_out), tuple(t for _, t in labels))
    want = [t.detach().numpy() for t in (loss, *kept)]
    _scoped(graph)
    _join(graph, _loss_graph(step, model_out, outputs, _opset(graph)))
    names = list(step.trainable)
    inits = {i.name: i for i in graph.graph.initializer}
    if any(n not in inits for n in names):
        raise Unsupported("the inference export lacks a trainable tensor")
    for n in names:  # the trainable tensors as inputs, after the feeds, as in the train step
        graph.graph.initializer.remove(inits[n])
        graph.graph.input.append(helper.make_tensor_value_info(n, inits[n].data_type, list(inits[n].dims)))
    if [i.name for i in graph.graph.input] != [*(n for n, _ in step.feeds), *names]:
        raise Unsupported("the eval step's inputs are not the feeds and the trainable tensors")
    if any(n.op_type in RANDOM_OPS or n.op_type == "Dropout" for n in graph.graph.node):
        raise Unsupported("a random operator in eval mode")
    arrays = [t.numpy() for _, t in step.feeds] + [t.numpy() for t in step.trainable.values()]
    fold_ifs(graph, arrays, set(range(len(step.feeds))))
    pruned(graph)
    check_board_loadable(graph, path.name)
    got = run(session(graph, path.name), arrays, path.name)
    diff = max(relative(g, w) for g, w in zip(got, want, strict=True))
    if diff > RTOL:
        raise Unsupported(f"{path.name} from the inference export differs from PyTorch by {diff:.3g}")
    onnx.save(graph, str(path))
    return diff


def _opset(graph: onnx.ModelProto) -> int:
    return next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))


def _scoped(graph: onnx.ModelProto) -> None:
    """The model's tensors named as the train step's export names them (``/layer/Conv_output_0``
    there ``/m/layer/Conv_output_0``: the prefix split finds its cut by name in both steps); its
    outputs renamed :data:`OUT` ``i``."""
    renamed = {o.name: f"{OUT}{k}" for k, o in enumerate(graph.graph.output)}
    for node in graph.graph.node:
        for o in node.output:
            if o and o not in renamed and o.startswith("/"):
                renamed[o] = SCOPE + o
    for node in graph.graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        node.output[:] = [renamed.get(o, o) for o in node.output]
    for o in graph.graph.output:
        o.name = renamed[o.name]
    del graph.graph.value_info[:]


def _loss_graph(step: StepInputs, model_out: list[Any], outputs: list[str], opset: int) -> onnx.ModelProto:
    """The loss alone, exported by the TorchScript exporter: inputs the model's outputs
    (:data:`OUT` ``i``) then the labels, outputs ``outputs``."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    n = len(model_out)

    class Loss(torch.nn.Module):
        def forward(self, *args: Any) -> Any:
            loss, kept = step.loss(tuple(args[:n]), args[n:])
            return (loss, *kept)

    labels = step.feeds[step.model_inputs :]
    names = [*(f"{OUT}{k}" for k in range(n)), *(name for name, _ in labels)]
    args = (*model_out, *(t for _, t in labels))
    axes = {name: {0: "batch"} for name, a in zip(names, args, strict=True) if a.dim() > 0}
    axes.update({name: {0: "batch"} for name in outputs[1:]})
    buffer = io.BytesIO()
    with quiet_output("torch.onnx.export: the loss"):
        try:
            torch.onnx.export(Loss(), args, buffer, dynamo=False, do_constant_folding=False, opset_version=opset,
                              input_names=names, output_names=outputs, dynamic_axes=axes)  # fmt: skip
        except Exception as exc:  # the exporter raises many types; the other eval step may still do
            raise Unsupported(f"the TorchScript export of the loss failed: {type(exc).__name__}") from exc
    loss = onnx.load_from_string(buffer.getvalue())
    if [o.name for o in loss.graph.output] != outputs:
        raise Unsupported("the loss's exported outputs are not the step's")
    return loss


def _join(graph: onnx.ModelProto, loss: onnx.ModelProto) -> None:
    """``graph`` followed by ``loss`` (its inner tensors renamed apart), in place: the inputs of
    both but the model's outputs, the loss's outputs."""
    inputs = {i.name for i in loss.graph.input}
    ends = {o.name for o in loss.graph.output}
    renamed = {t: f"loss{t}" if t.startswith("/") else f"loss/{t}"
               for t in [*(o for n in loss.graph.node for o in n.output), *(i.name for i in loss.graph.initializer)]
               if t and t not in inputs and t not in ends}  # fmt: skip
    for node in loss.graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        node.output[:] = [renamed.get(o, o) for o in node.output]
        node.name = f"loss{node.name}" if node.name.startswith("/") else f"loss/{node.name}"
    for init in loss.graph.initializer:
        init.name = renamed.get(init.name, init.name)
    if any(o.domain not in ("", "ai.onnx") for o in loss.opset_import):
        raise Unsupported("the loss's export uses a custom domain")
    graph.graph.node.extend(loss.graph.node)
    graph.graph.initializer.extend(loss.graph.initializer)
    graph.graph.input.extend(i for i in loss.graph.input if not i.name.startswith(OUT))
    del graph.graph.output[:]
    graph.graph.output.extend(loss.graph.output)
