"""Recurrent layers (ONNX LSTM, GRU, RNN nodes) in a training graph.

A recurrent layer is a sequence model's feature layer: ``last-conv+classifier`` counts the last one
before the classifier as its "last layer" (:mod:`tasks.prepare.selection`). Two limits of ONNX
Runtime 1.19.2 are checked here, before any probe runs:

- An LSTM or GRU that receives a gradient (a trainable layer lies before it) must train its input
  and recurrence weights (an RNN is unrolled into plain operators, :mod:`tasks.prepare.rewrites.rnn`, and may
  stay frozen): with a frozen W or R its LSTMGrad/GRUGrad kernel dies on an invalid memory
  access (SIGSEGV, measured on a conv + GRU and a conv + LSTM model: W frozen, R frozen or both;
  a frozen bias B trains). The recipe is refused naming the layer by its full module path, with
  the two ways out.
- An ``nn.LSTM``/``nn.GRU``/``nn.RNN`` with ``dropout`` between its stacked layers cannot be
  exported in training mode (torch's exporter has no random dropout inside an RNN node), so export
  traces such a module in eval mode: no dropout between its stacked layers while fine-tuning
  (:func:`recurrent_dropout_modules`).
"""

from __future__ import annotations

import fnmatch
from typing import Any

import onnx

from tasks.errors import RecipeError
from tasks.prepare.graph import downstream
from tasks.prepare.node_names import layer_of
from tasks.prepare.selection import RECURRENT, layer_params, weight_sources

STATE_INPUTS = (0, 5, 6)  # X, initial_h and (LSTM) initial_c: what a gradient flows back through
WEIGHT_INPUTS = (1, 2)  # W and R: frozen, their gradient kernel dies (B may stay frozen)


def recurrent_dropout_modules(model: Any) -> list[tuple[str, Any]]:
    """(module path, module) of the ``torch.nn.RNNBase`` submodules of ``model`` with dropout
    between stacked layers (or set on a single layer, where it does nothing but stop the export)."""
    import torch  # torch (heavy) only when a PyTorch model is exported

    return [
        (name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.RNNBase) and m.dropout > 0
    ]


def check_recurrent(model: onnx.ModelProto, trainable: list[str], params: dict[str, int]) -> None:
    """RecipeError naming the first recurrent layer that a gradient flows through while its input
    or recurrence weights (W, R) stay frozen (ONNX Runtime 1.19.2 crashes there; a frozen bias B is
    fine)."""
    chosen = set(trainable)
    if not chosen or not any(n.op_type in RECURRENT for n in model.graph.node):
        return
    sources = weight_sources(model, params)
    needs = downstream(model, chosen)
    for node in model.graph.node:
        if node.op_type not in RECURRENT or node.op_type == "RNN":  # an RNN is unrolled (rewrites.rnn)
            continue
        states = [node.input[k] for k in STATE_INPUTS if k < len(node.input) and node.input[k]]
        weights = [p for k in WEIGHT_INPUTS for p in sorted(sources.get(node.input[k], ()))]
        frozen = [p for p in weights if p not in chosen]
        if frozen and any(s in needs for s in states):
            raise _refusal(model, node, layer_params(node, sources), frozen, chosen, sources)


def _refusal(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    own: list[str],
    frozen: list[str],
    chosen: set[str],
    sources: dict[str, set[str]],
) -> RecipeError:
    """The one line for a frozen recurrent layer between trainable ones, with both ways out."""
    layer, op = layer_of(node.name or node.output[0]), node.op_type
    before = _trainable_layers_before(model, node, chosen, sources)
    pattern = f"{layer}.*"
    also = (
        f"trainable.patterns = ['{pattern}']"
        if fnmatch.filter(own, pattern) == own
        else f"trainable.names = {own}"
    )
    return RecipeError(
        "trainable",
        f"the {op} layer '{layer}' (ONNX node '{node.name}') to train whenever a layer before it trains "
        f"(here {', '.join(before[:3])}): ONNX Runtime 1.19.2 crashes computing a gradient through a {op} "
        f"whose input or recurrence weights are frozen; train it too ({also} beside the others) or freeze what precedes it "
        f"(trainable.train_from = '{node.name}')",
        f"{layer} frozen" if not chosen & set(own) else f"{layer} partly frozen: {frozen}",
    )


def _trainable_layers_before(
    model: onnx.ModelProto, node: onnx.NodeProto, chosen: set[str], sources: dict[str, set[str]]
) -> list[str]:
    """Module paths of the layers before ``node`` that read data and train (not the nodes that only
    reshape a weight)."""
    out: list[str] = []
    for other in model.graph.node:
        if other is node:
            break
        reads_data = not all(i in sources or i == "" for i in other.input)
        if reads_data and any(p in chosen for p in layer_params(other, sources)):
            out.append(layer_of(other.name or other.output[0]))
    return list(dict.fromkeys(out))
