"""Registered buffers are not parameters: what a PyTorch model's export records about its own state.

``torch.nn.Module.register_buffer`` holds constants that travel with a model's weights (BatchNorm's
running statistics, an audio front-end's DFT matrices and mel filterbank, positional tables). The
exporter writes them as ONNX initializers under their ``named_buffers()`` names, beside the
parameters, and an ONNX graph alone cannot tell them apart. So the export records, in the model's
metadata, which initializers are buffers and how many elements torch's ``parameters()`` hold:
no strategy trains a buffer, a recipe naming one is told so in one line, and "trains X of Y
parameters" counts what torch counts (a parameter the exporter drops because ``forward`` never
reads it still counts, as it does in ``sum(p.numel() for p in model.parameters())``).

A model that comes as an ONNX file has no such record: its float initializers are its parameters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx

BUFFERS_KEY = "odl.torch_buffers"
PARAMETERS_KEY = "odl.torch_parameter_count"


def _metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def record_torch_state(module: Any, path: Path) -> None:
    """Write into the ONNX file at ``path`` which of its initializers are ``module``'s registered
    buffers and torch's parameter count (the file is rewritten in place)."""
    model = onnx.load(str(path))
    inits = {i.name for i in model.graph.initializer}
    buffers = sorted(name for name, _ in module.named_buffers() if name in inits)
    count = sum(p.numel() for p in module.parameters())
    kept = [p for p in model.metadata_props if p.key not in (BUFFERS_KEY, PARAMETERS_KEY)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.helper.set_model_props(
        model, {**_metadata(model), BUFFERS_KEY: json.dumps(buffers), PARAMETERS_KEY: str(count)}
    )
    onnx.save(model, str(path))


def torch_buffers(model: onnx.ModelProto) -> set[str]:
    """The initializers of ``model`` that are registered buffers of the PyTorch model it was
    exported from (empty for a model without that record)."""
    names = json.loads(_metadata(model).get(BUFFERS_KEY, "[]"))
    return set(names) & {i.name for i in model.graph.initializer}


def torch_parameter_count(model: onnx.ModelProto) -> int | None:
    """``sum(p.numel() for p in parameters())`` of the PyTorch model ``model`` was exported from,
    or None for a model without that record."""
    value = _metadata(model).get(PARAMETERS_KEY)
    return int(value) if value is not None else None
