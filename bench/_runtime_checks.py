"""Two checks of bench/runtimes.py's autograd rows.

:func:`gradient_vs_torch`: the train step against PyTorch's own autograd on one batch of the
recipe's data (``train_step.onnx`` run by ONNX Runtime against ``loss.backward()`` of the model in
the step's mode). :func:`perturbed` : the autograd job started from its weights moved by one ulp
(``np.nextafter`` towards +inf), whose distance from the unperturbed job after the same steps is
how far float32 rounding alone carries a run: the scale a difference between the runtimes is
measured against.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from device_agent.protocol import BlobRef, file_sha256


def perturbed(spec: Any, files: dict[str, Path], folder: Path) -> tuple[Any, dict[str, Path]]:
    """The autograd job (spec, files) with every initial weight one ulp higher, as job ``-ulp``."""
    source = files[spec.artifacts["checkpoint"].sha256]
    with np.load(source) as ckpt:
        moved = {k: np.nextafter(ckpt[k], np.float32(np.inf)) for k in ckpt.files}
    path = folder / "checkpoint-ulp.npz"
    np.savez(path, **moved)
    blob = BlobRef(file_sha256(path), path.stat().st_size)
    named = folder / blob.sha256
    shutil.copyfile(path, named)
    artifacts = {**spec.artifacts, "checkpoint": blob}
    return replace(spec, job_id=f"{spec.job_id}-ulp", artifacts=artifacts), {**files, blob.sha256: named}


def gradient_vs_torch(recipe: Any, prepared: Any, batch: int) -> dict[str, Any]:
    """The largest difference of the step's gradients from PyTorch's, each relative to its
    gradient's largest |value| (at least 1), and of the loss (relative), on ``batch`` samples."""
    import onnx  # heavy: loaded when the check runs, as bench/runtimes.py loads the host code
    import onnxruntime  # the inference build's API, as the board's
    import torch  # torch (heavy) only when a PyTorch model is built or run

    from tasks.prepare.export.torch_model import build_model  # host code, loaded when the check runs
    from tasks.prepare.runtimes.autograd.build import (
        exported_weights,
    )  # host code, loaded when the check runs
    from tasks.prepare.runtimes.autograd.losses import plan  # host code, loaded when the check runs
    from tasks.prepare.runtimes.autograd.steps import model_inputs  # host code, loaded when the check runs
    from tasks.prepare.runtimes.autograd.trace import step_mode  # host code, loaded when the check runs

    art = prepared.artifacts_dir
    step = json.loads((art / "step.json").read_text())
    if step.get("noise"):
        return {"grad_text": "random draws in the step"}
    model = exported_weights(build_model(recipe), onnx.load(str(prepared.model_onnx)))
    inputs = model_inputs(recipe, batch)
    with torch.no_grad():
        out = model.eval()(*inputs)
    loss_plan = plan(recipe, tuple(out) if isinstance(out, (tuple, list)) else (out,), batch)
    trainable = [t["name"] for t in step["trainable"]]
    params = dict(model.named_parameters())
    for name, p in params.items():
        p.requires_grad_(name in trainable)
    with step_mode(model, True, recipe.trainable.batchnorm, inputs, len(recipe.model.output_names)):
        out = model(*inputs)
        loss, _ = loss_plan.fn(
            tuple(out) if isinstance(out, (tuple, list)) else (out,), tuple(t for _, t in loss_plan.labels)
        )
        loss.backward()
    with np.load(art / "checkpoint.npz") as ckpt:
        weights = dict(ckpt)
    feeds = {
        n: t.numpy() for n, t in [*zip(recipe.model.input_names, inputs, strict=True), *loss_plan.labels]
    }
    session = onnxruntime.InferenceSession(str(art / "train_step.onnx"), providers=["CPUExecutionProvider"])
    got = dict(zip(step["outputs"] + step["gradients"], session.run(None, {**feeds, **weights}), strict=True))
    worst, where = 0.0, ""
    for name in trainable:
        want = params[name].grad.numpy()
        diff = float(np.abs(got[f"{name}_grad"] - want).max()) / max(1.0, float(np.abs(want).max()))
        worst, where = max((worst, where), (diff, name))
    loss_rel = abs(float(got["loss"]) - loss.item()) / max(1e-12, abs(loss.item()))
    return {"grad_vs_torch": worst, "grad_worst_tensor": where, "loss_vs_torch": loss_rel, "grad_batch": batch,
            "grad_text": f"{worst:.1e}"}  # fmt: skip
