"""What ``manifest.json`` says of a prepared folder whichever runtime built it: each file's entry
(path, sha256, size) and what trains, by layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from tasks.hashing import file_sha256
from tasks.prepare.node_names import layer_of
from tasks.prepare.selection import layer_params, weight_sources


def file_entry(path: Path, rel: str) -> dict[str, Any]:
    """``{"path", "sha256", "size"}`` for one file."""
    return {"path": rel, "sha256": file_sha256(path), "size": path.stat().st_size}


def trainable_layers(model: onnx.ModelProto, trainable: list[str], counts: dict[str, int]) -> list[dict]:
    """What trains, by layer in graph order: ``{"layer", "ops", "params"}`` (the PyTorch module
    path of the exporter's node names, the operator types reading the layer's trainable tensors,
    their element count); tensors no node reads directly are grouped under their own names."""
    sources, chosen = weight_sources(model, trainable), set(trainable)
    rows: dict[str, dict] = {}
    seen: set[str] = set()
    for node in model.graph.node:
        mine = [p for p in layer_params(node, sources) if p in chosen and p not in seen]
        if not mine:
            continue
        seen.update(mine)
        row = rows.setdefault(layer_of(node.name or node.output[0]), {"ops": [], "params": 0})
        row["ops"] += [node.op_type] if node.op_type not in row["ops"] else []
        row["params"] += sum(counts.get(p, 0) for p in mine)
    for name in [p for p in trainable if p not in seen]:
        rows[name] = {"ops": [], "params": counts.get(name, 0)}
    return [{"layer": k, **v} for k, v in rows.items()]
