"""One-line messages for what the exporter and ONNX Runtime's artifact generation refuse: the
operator, the node or module, the layer it belongs to and what to change (never C++ positions,
assertion text or a traceback)."""

from __future__ import annotations

import os
import re
import traceback
from typing import Any

import onnx

from tasks.errors import RecipeError, ort_message
from tasks.prepare.graph import downstream
from tasks.prepare.node_names import layer_of
from tasks.prepare.onnx_versions import OPSET
from tasks.prepare.trainable import find_classifier, parameters
from tasks.recipe.schema import Recipe

__all__ = ["export_failure", "generate_failure", "layer_of", "no_gradient_message"]
_NO_GRADIENT = re.compile(r"gradient builder has not been registered:\s*(\w+)(?: for node\s*(\S*))?")


def no_gradient_message(error: str, model: onnx.ModelProto, trainable: list[str]) -> str | None:
    """One line for ORT's "gradient builder has not been registered" error, else None."""
    match = _NO_GRADIENT.search(error)
    if not match:
        return None
    op, node_name = match.group(1), match.group(2) or ""
    nodes = [n for n in model.graph.node if n.op_type == op and (not node_name or n.name == node_name)]
    needs = downstream(model, set(trainable))
    on_path = [n for n in nodes if any(i in needs for i in n.input)]
    where = (on_path or nodes or [None])[0]
    name = where.name if where is not None else node_name or "?"
    return (
        f"ONNX Runtime 1.19.2 has no gradient for {op} (node {name}, layer {layer_of(name)}), which lies between "
        f"the trainable parameters and the loss: make only parameters after that layer trainable "
        f"(freeze everything before it: {_what_works(model, where)}), or replace the {op} in the model"
    )


def _what_works(model: onnx.ModelProto, node: onnx.NodeProto | None) -> str:
    """Whether the 'classifier' strategy avoids ``node``'s gradient, said as advice."""
    params = parameters(model)
    try:
        names, _ = find_classifier(model, params)
    except RecipeError:
        return "trainable.patterns naming later layers"
    if node is not None and any(i in downstream(model, set(names)) for i in node.input):
        return "trainable.patterns naming layers after it; the classifier alone still needs it"
    return "trainable.strategy = 'classifier' avoids it, or trainable.patterns naming layers after it"


def vector_matmul_message(error: str, model: onnx.ModelProto) -> str | None:
    """One line for ORT's MatMul gradient refusing a 1-D operand (``x @ v``, a soft-argmax's
    expectation over pixel positions), else None."""
    found = re.search(r"Node \((\S+?)_Grad/\S*\) Op \(\w*MatMul\w*\).*Incompatible dimensions", error)
    if not found:
        return None
    vectors = {i.name for i in model.graph.initializer if len(i.dims) == 1}
    node = next((n for n in model.graph.node if n.name == found.group(1) and n.op_type == "MatMul"), None)
    if node is None or not vectors & set(node.input):
        return None
    layer = layer_of(node.name)
    where = f" (layer {layer})" if layer != node.name else " (in the model's own forward)"
    return (
        f"ONNX Runtime 1.19.2 cannot differentiate MatMul node {node.name}{where}: one operand is a 1-D "
        "vector (x @ v); write it as (x * v).sum(-1) or multiply by a [n, 1] matrix"
    )


def generate_failure(error: str, model: onnx.ModelProto, trainable: list[str]) -> str:
    """One line for a generate_artifacts failure, without ORT's C++ source positions."""
    specific = no_gradient_message(error, model, trainable) or vector_matmul_message(error, model)
    if specific:
        return specific
    text = ort_message(error)
    what = text or "an internal check of ONNX Runtime failed"
    return (
        f"generate_artifacts could not build the training graph ({what}): try trainable parameters nearer "
        "the outputs (trainable.strategy = 'classifier'); -v logs the exporter and ONNX Runtime output"
    )


def export_failure(recipe: Recipe, exc: BaseException, dump: str) -> str:
    """One line for an exporter failure: the operator, the module that uses it and what to change.

    The failing node comes from the exporter's traceback, else from the TorchScript graph it printed
    (``dump``): the first node of that operator, whose ``scope:`` names the module.
    """
    node = _failing_node(exc)
    kind = node.kind() if node is not None else _kind_in_message(str(exc))
    scope = node.scopeName() if node is not None else _scope_in_dump(kind, dump)
    packed = None if kind else _packed_rnn(dump)
    kind, scope = packed or (kind, scope)
    op, module = kind.rpartition("::")[2], _module_of(scope) if scope else ""
    where = f"operator {op}" + (f" in {module}" if module else "") + ": " if op else ""
    layer = module.partition(" (")[0] or "the code that uses it"
    if packed:  # the exporter's own error is a C++ range check naming nothing
        reason, hint = (f"{layer} is fed a packed sequence (nn.utils.rnn.pack_padded_sequence), which torch's "
                        "exporter cannot write", f"feed {layer} the padded batch and read each sequence's last "
                        "valid step with a gather at lengths - 1 (or mask the padding)")  # fmt: skip
    elif _exporter_broke(exc):  # its own Python error: "'NoneType' object is not subscriptable"
        reason = (f"torch's exporter broke in its own translation of {op or 'an operator'} "
                  f"({type(exc).__name__}: {_reason(exc)}): an argument it needs as a constant, such as a "
                  "size, is computed from a tensor's shape at run time")  # fmt: skip
        hint = (f"give {layer} sizes fixed when the model is built (Python ints for model.input_shape "
                f"{list(recipe.model.input_shape)}) or write that step with other operators")  # fmt: skip
    else:
        reason, hint = _reason(exc), _hint(recipe, exc, op, layer)
    return " ".join(f"cannot export {recipe.model.ref} to ONNX: {where}{reason}; {hint}".split())


def _packed_rnn(dump: str) -> tuple[str, str] | None:
    """(``aten::gru`` & co., its scope) of the first recurrent node of a printed TorchScript graph
    that reads the batch sizes of a packed sequence; None when there is none."""
    for sizes in re.findall(r", %([\w.]+) : \w+\([^)]*\)[^=]*= aten::_pack_padded_sequence\(", dump):
        found = re.search(
            rf"= (aten::(?:lstm|gru|rnn_tanh|rnn_relu))\(%[\w.]+, %{re.escape(sizes)},.*?scope: (\S+)", dump
        )
        if found:
            return found.group(1), found.group(2)
    return None


def _failing_node(exc: BaseException) -> Any:
    """The TorchScript node the exporter was converting when it failed (None if not in the traceback)."""
    node, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_run_symbolic_function":
            node = tb.tb_frame.f_locals.get("node", node)
        tb = tb.tb_next
    return node


def _exporter_broke(exc: BaseException) -> bool:
    """Whether ``exc`` is a Python error of the exporter's own code (a symbolic function indexing a
    shape it could not read), not a refusal it words: raised inside ``torch/onnx``."""
    frames = traceback.extract_tb(exc.__traceback__)
    inside = bool(frames) and f"{os.sep}torch{os.sep}onnx{os.sep}" in frames[-1].filename
    return inside and isinstance(exc, (TypeError, AttributeError, IndexError, KeyError))


def _kind_in_message(message: str) -> str:
    """``aten::op`` named by an exporter error message, or ``""``."""
    found = re.search(r"operator '([\w:.]+)'|export of operator (\w+)|namespace ([\w:.]+?)\.?\s", message)
    name = next((g for g in found.groups() if g), "") if found else ""
    return name if "::" in name or not name else f"aten::{name}"


def _scope_in_dump(kind: str, dump: str) -> str:
    """The ``scope:`` of the first ``kind`` node in a printed TorchScript graph, or ``""``."""
    found = re.search(rf"= {re.escape(kind)}\(.*?, scope: (\S+)", dump) if kind else None
    return found.group(1) if found else ""


def _module_of(scope: str) -> str:
    """The full module path and class from a TorchScript scope: ``stage2.blocks.1.rnn (GRU)`` from
    ``...Net::/...Stage::stage2/...Sequential::blocks/...Unit::blocks.1/...GRU::rnn`` (a name such as
    ``rnn`` alone is ambiguous when several stages have one)."""
    parts = [p.partition("::") for p in scope.split("/") if p]
    names = [name for _, _, name in parts if name]
    path = layer_of("/" + "/".join(names) + "/op") if names else ""
    cls = parts[-1][0] if parts else ""
    return f"{path or 'the forward of the model'} ({cls.rpartition('.')[2]})"


def _reason(exc: BaseException) -> str:
    """The exporter's first line without its boilerplate (issue-tracker plea, graph values)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return re.split(r"\s*(?:Please feel free|\[Caused by|, try exporting with)", first)[0].rstrip(" .")


def _hint(recipe: Recipe, exc: BaseException, op: str, module: str) -> str:
    """What to change for this failure of ``op`` in ``module``."""
    if op.startswith(("adaptive_avg_pool", "adaptive_max_pool")):
        return (
            f"use a model.input_shape whose feature map before {module} is a multiple of its output "
            f"size (e.g. larger than {list(recipe.model.input_shape)})"
        )
    # torch.fft and a complex torch.stft give complex tensors, which the exporter cannot write
    if op.startswith("fft_") or (op == "stft" and "complex" in str(exc)):
        return (
            f"compute the spectrum in {module} without complex tensors: torch.stft(..., return_complex=False), "
            "or products with cos and sin DFT matrices held as registered buffers"
        )
    if "not supported" in str(exc) or "unrecognized namespace" in str(exc):
        return f"rewrite {module} with operators ONNX opset {OPSET} supports, or replace that module"
    return f"simplify or replace {module}; the exporter's output is logged at DEBUG level"
