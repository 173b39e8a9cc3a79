"""What ``manifest.json`` says of a prepared folder whichever runtime built it: each file's entry
(path, sha256, size) and what trains, by layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from tasks.hashing import file_sha256
from tasks.prepare.node_names import layer_of
from tasks.prepare.onnx_versions import onnx_opset
from tasks.prepare.selection import layer_params, weight_sources
from tasks.recipe.load import recipe_hash
from tasks.recipe.schema import Recipe


def file_entry(path: Path, rel: str) -> dict[str, Any]:
    """``{"path", "sha256", "size"}`` for one file."""
    return {"path": rel, "sha256": file_sha256(path), "size": path.stat().st_size}


def trainable_layers(model: onnx.ModelProto, trainable: list[str], counts: dict[str, int]) -> list[dict]:
    """What trains, by layer in graph order: ``{"layer", "ops", "params"}`` (the PyTorch module
    path of the exporter's node names, the operator types reading the layer's trainable tensors,
    directly or through nodes of weights alone, their element count); tensors no node reads are
    grouped under their own names."""
    sources, chosen = weight_sources(model, trainable), set(trainable)
    rows: dict[str, dict] = {}
    seen: set[str] = set()
    # a node computed from weights alone (the Slice/Concat reordering an LSTM's gates, a Transpose of
    # a weight) is not the layer: its reader is; such a node counts only when no other node reads it
    acting = [n for n in model.graph.node if not all(o in sources for o in n.output)]
    for node in [*acting, *model.graph.node]:
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


def common_manifest(
    recipe: Recipe,
    out_dir: Path,
    files: dict[str, str],
    model: onnx.ModelProto,
    trainable: list[str],
    frozen: list[str],
    counts: dict[str, int],
    loss: str,
) -> dict[str, Any]:
    """The ``manifest.json`` keys both runtimes write: each of ``files`` (key -> path under
    ``out_dir``) and ``model.onnx`` as :func:`file_entry`, what trains and what stays frozen with
    their element counts, the model's opset and IR version, the onnxruntime the graphs were checked
    with, the loss output, the recipe's hash and an empty warning list."""
    import onnxruntime  # only its version: the host's runtime the graphs were built and checked with

    entries = {k: file_entry(out_dir / rel, rel) for k, rel in files.items()}
    entries["model"] = file_entry(out_dir / "model.onnx", "model.onnx")
    return {
        "files": entries,
        "trainable": trainable,
        "frozen": frozen,
        "trainable_count": sum(counts[n] for n in trainable),
        "frozen_count": sum(counts[n] for n in frozen),
        "opset": onnx_opset(model),
        "ir_version": model.ir_version,
        "ort_version": onnxruntime.__version__,
        "loss": loss,
        "recipe_hash": recipe_hash(recipe),
        "warnings": [],
    }
