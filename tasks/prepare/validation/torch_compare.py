"""Validation's comparison of the exported inference model with the PyTorch model it came from:
the same outputs on ``COMPARED`` samples of the recipe's data, within ``MATCH_TOL``."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from tasks.errors import ValidationFailed, ort_message
from tasks.prepare.export.torch_model import build_model
from tasks.prepare.export.tracing import model_outputs
from tasks.prepare.feeds import Feeds, data_file, example_arrays
from tasks.prepare.messages import layer_of
from tasks.prepare.sandbox.ort_parent import RunFailed
from tasks.prepare.sandbox.supervise import graph_io, run_graph, supervised
from tasks.recipe.schema import Recipe

MATCH_TOL = 1e-3
COMPARED = 16  # samples the inference model and PyTorch are compared on


def compare_with_torch(recipe: Recipe, inference_path: Path, manifest: dict) -> dict[str, Any]:
    """Load the trained weights into the PyTorch model and compare outputs with the inference model."""
    if recipe.model.kind == "onnx":
        return {"skipped": "model.kind is onnx: no PyTorch model to compare with"}
    import torch  # torch (heavy) only when a PyTorch model is built or run

    model = build_model(recipe)
    state = model.state_dict()
    trained = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(inference_path)).graph.initializer}
    loaded = {k: torch.from_numpy(trained[k].copy()) for k in state if k in trained}
    missing = [n for n in manifest["trainable"] if n not in loaded]
    if missing:
        raise ValidationFailed(
            "inference_matches_torch",
            f"trained parameters {missing[:4]} have no PyTorch counterpart of the same name",
        )
    state.update(loaded)  # in place: the dict keeps the module versions some models check (MNASNet)
    model.load_state_dict(state)
    inputs = example_arrays(recipe, recipe.model.input_names, n=COMPARED)
    ort_out, again = _inference_twice(recipe, inference_path, inputs, manifest["inference_output_names"])
    if not all(np.array_equal(a, b) for a, b in zip(ort_out, again, strict=True)):
        raise ValidationFailed("inference_matches_torch", _random_nodes(inference_path))
    with torch.no_grad():
        out = model(*[torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
    outs = model_outputs(out)
    outs = outs[1:] if recipe.loss.kind == "embedded" else outs
    diff = max(float(np.abs(o.numpy() - r).max()) for o, r in zip(outs, ort_out, strict=True))
    # float32 rounding grows with the outputs' magnitude and with depth: the tolerance does too
    # (1e-3 up to |y| = 1 and 50 weighted layers, x sqrt(layers / 50) beyond: ResNet-152 differs
    # by 1.1e-4 of its output scale once its BatchNorms are frozen into Mul/Add, timm's
    # ConvMixer-768/32 at random init by 4.2e-4; a wrong weight or operator differs by far more)
    scale = max(1.0, *(float(np.abs(o.numpy()).max()) for o in outs))
    layers = sum(n.op_type in ("Conv", "Gemm", "MatMul") for n in onnx.load(str(inference_path)).graph.node)
    tol = MATCH_TOL * scale * max(1.0, math.sqrt(layers / 50))
    if not diff < tol:
        raise ValidationFailed(
            "inference_matches_torch",
            f"max abs diff {diff:.3g} >= {tol:.3g} (= {MATCH_TOL} x max(1, max |output| = {scale:.3g}) x "
            f"max(1, sqrt({layers} layers / 50))) between the exported inference model and PyTorch with the same weights",
        )
    return {
        "max_abs_diff": diff,
        "tolerance": tol,
        "output_scale": scale,
        "compared_samples": len(inputs[0]),
        "loaded_tensors": len(loaded),
    }


def _inference_twice(
    recipe: Recipe, path: Path, inputs: list[np.ndarray], outputs: list[str]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The inference model's ``outputs`` on ``inputs``, computed twice, in the stage's child."""
    failed = functools.partial(ValidationFailed, "inference_matches_torch")
    with supervised("validation", error=failed):
        try:
            names = [name for name, _, _ in graph_io(path)[0]]
            feeds = Feeds(
                dict(zip(names, inputs, strict=False)), f"{COMPARED} samples of {data_file(recipe)[0]}"
            )
            what = "running the probe's exported inference model"
            first, again = (run_graph(path, feeds, what, outputs) for _ in range(2))
            return list(first.values()), list(again.values())
        except RunFailed as exc:
            raise failed(
                f"the exported inference model does not run: {ort_message(exc.error)[:300]}"
            ) from exc


def _random_nodes(inference_path: Path) -> str:
    """Why the exported model answers twice differently: its random nodes and their layers."""
    nodes = [
        n.name
        for n in onnx.load(str(inference_path)).graph.node
        if n.op_type.startswith(("Random", "Bernoulli"))
    ]
    layers = sorted({layer_of(n) for n in nodes})
    return (
        f"the exported inference model gives two different answers to the same input: {len(nodes)} random "
        f"node(s) in layers {layers[:4]}{' ...' if len(layers) > 4 else ''}; make those layers deterministic "
        "at export (eval mode), as the pipeline does for submodules that drop paths at random"
    )
