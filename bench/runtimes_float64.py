"""Which runtime's gradient is closer to float64: one train step of a recipe on one batch, the
autograd runtime's ``train_step.onnx`` (ONNX Runtime), the ORT runtime's training graph (ONNX
Runtime's training API) and PyTorch in float32, each against PyTorch in float64 from the same
weights, per trainable tensor; and the first-order bound AdamW puts on the two runtimes' weight
difference after ``--steps`` steps: sum of the schedule's rates x max |g_autograd - g_ort| / eps.

Both runtimes are prepared as bench/runtimes.py prepares them (one state_dict, no frozen-prefix
cache, dropout off where it overrides it), so run that first for the recipe.

    .venv/bin/python bench/runtimes_float64.py mobilenet_v2.toml
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from tasks.paths import PROJECT_ROOT, state_dir  # noqa: E402


def gradients(recipe_file: str, batch: int) -> tuple[object, dict[str, dict[str, np.ndarray]]]:
    """(the recipe, {source: {tensor: gradient}}) for autograd, ort, float32 and float64."""
    import onnx  # heavy: the host's packages, loaded once ODL_HOME is set (as bench/runtimes.py)
    import onnxruntime  # heavy, as onnx above
    import torch  # heavy, as onnx above
    from onnxruntime.training.api import CheckpointState, Module  # the ORT runtime's graphs, as onnx above

    from bench.runtimes import NO_DROPOUT, prepared_for  # host code, as onnx above
    from tasks.prepare.export.torch_model import build_model  # host code, as onnx above
    from tasks.prepare.runtimes.autograd.build import exported_weights  # host code, as onnx above
    from tasks.prepare.runtimes.autograd.losses import plan  # host code, as onnx above
    from tasks.prepare.runtimes.autograd.trace import step_mode  # host code, as onnx above
    from tasks.recipe.load import load_recipe  # host code, as onnx above

    name = load_recipe(PROJECT_ROOT / "recipes" / recipe_file).name
    overrides = {**NO_DROPOUT.get(recipe_file, {}), "training.prefix_cache": "off", "trainable.batchnorm_calibration": 0,
                 "model.weights": str(state_dir("cache", "bench", "runtimes", name) / "weights.pt")}  # fmt: skip
    recipe, ag = prepared_for(recipe_file, overrides, "autograd")
    _, ort = prepared_for(recipe_file, overrides, "ort-training")
    data = np.load(recipe.data.train)
    x, y = data["x"][:batch], data["y"][:batch].astype(np.int64)
    step = json.loads((ag.artifacts_dir / "step.json").read_text())
    names = [t["name"] for t in step["trainable"]]
    with np.load(ag.artifacts_dir / "checkpoint.npz") as ckpt:
        weights = dict(ckpt)
    session = onnxruntime.InferenceSession(
        str(ag.artifacts_dir / "train_step.onnx"), providers=["CPUExecutionProvider"]
    )
    out = dict(
        zip(
            step["outputs"] + step["gradients"],
            session.run(None, {"input": x, "labels": y, **weights}),
            strict=True,
        )
    )
    grads = {"autograd": {n: out[f"{n}_grad"] for n in names}}
    state = CheckpointState.load_checkpoint(str(ort.artifacts_dir / "checkpoint"))
    module = Module(
        str(ort.artifacts_dir / "training_model.onnx"), state, str(ort.artifacts_dir / "eval_model.onnx")
    )
    module.train()
    module.lazy_reset_grad()
    module(x, y)
    grads["ort"] = {n: np.array(state.parameters[n].grad) for n in names}
    for label, dtype in (("float32", torch.float32), ("float64", torch.float64)):
        model = exported_weights(build_model(recipe), onnx.load(str(ag.model_onnx))).to(dtype)
        params = dict(model.named_parameters())
        for n, p in params.items():
            p.requires_grad_(n in names)
        inputs = (torch.from_numpy(x).to(dtype),)
        with step_mode(model, True, recipe.trainable.batchnorm, inputs, 1):
            outputs = (model(*inputs),)
            loss, _ = plan(recipe, outputs, batch).fn(outputs, (torch.from_numpy(y),))
            loss.backward()
        grads[label] = {n: params[n].grad.double().numpy() for n in names}
    return recipe, grads


def main() -> int:
    """Print the per-tensor table and the AdamW bounds."""
    from device_agent.job.schedule import lr_at  # as TrainParams above
    from device_agent.jobspec import TrainParams  # the agent's own schedule, after ODL_HOME is set

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", help="a file of recipes/ that bench/runtimes.py has run")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    os.environ.setdefault("ODL_HOME", str(state_dir("cache", "bench", "runtimes-home")))
    recipe, grads = gradients(args.recipe, args.batch)
    opt = recipe.optimizer
    params = TrainParams(batch_size=args.batch, epochs=1, lr=opt.lr, warmup_steps=recipe.schedule.warmup_steps,
                         final_lr_ratio=recipe.schedule.final_lr_ratio)  # fmt: skip
    rates = sum(lr_at(t, args.steps, params) for t in range(args.steps))
    sources = ("autograd", "ort", "float32")
    print(f"{'tensor':24s} {'max |g|':>9s}  " + "  ".join(f"{k + ' vs f64':>16s}" for k in sources)
          + f"  {'autograd vs ort':>16s}  {'AdamW bound':>12s}")  # fmt: skip
    for name, g64 in grads["float64"].items():
        cells = "  ".join(f"{np.abs(grads[k][name] - g64).max():16.2e}" for k in sources)
        gap = float(np.abs(grads["autograd"][name].astype(np.float64) - grads["ort"][name]).max())
        bound = f"{rates * gap / 1e-6:12.2e}" if opt.kind == "adamw" else f"{'-':>12s}"
        print(f"{name:24s} {np.abs(g64).max():9.2e}  {cells}  {gap:16.2e}  {bound}")
    print(f"AdamW bound: sum of the {args.steps} steps' rates ({rates:.4f}) x |g_autograd - g_ort| / eps (1e-6), a "
          "first-order bound on the weights' difference (loose where |g| >> eps)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
