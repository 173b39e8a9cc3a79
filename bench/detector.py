"""On-board training of the SSD-Lite detector (300x300): the device agent vs a bare ORT loop vs PyTorch.

recipes/ssdlite_mobilenet_v2.toml (recipes/ssdlite.py, its multibox loss inside the ONNX graph:
task "embedded", feeds images=x, labels=y, gt_offsets=offsets) is prepared once (the exported
graphs have a dynamic batch axis). For batch 4 and 8, in one run:

1. the device agent trains ``WARMUP + STEPS`` steps of one epoch (the recipe's train set tiled,
   no eval set, no intermediate checkpoint) in the torch-free board venv; samples/s over the
   steps after the warm-up (from its step events) and its peak RSS (``result.json``, VmHWM);
2. a bare ONNX Runtime loop (``onnxruntime.training.api`` Module + Optimizer) over the same
   artifacts, data and batch order, in its own subprocess of the board venv (the bare loop and
   the torch loop follow the agent's learning-rate schedule, device_agent.job.trainer.lr_at);
3. a PyTorch CPU loop in its own subprocess of the host venv: the same model with the exported
   weights, the manifest's trainable parameters, AdamW with the same lr and weight decay,
   BatchNorm in eval mode (the recipe freezes it), the same batches, ``torch.set_num_threads``
   equal to ONNX Runtime's default intra-op pool (the physical cores);
4. the ratios agent / bare ORT and agent / torch;
5. the offline validation's ``board_peak_estimate_mb`` (tasks.prepare.validation.validate with
   ``training.batch_size`` overridden, as bench/memory.py, and ``data.train`` set to the tiled
   set the loops train on: its probe holds the whole set in RAM, and the agent's one epoch maps
   every row of it) vs the agent's measured peak RSS, target within +-15 %.

The three loops train the same function from the same weights on the same batches, so their
first-step losses agree (the JSON keeps the first and last loss of each). Prints two tables, writes bench/results/detector.json.

    .venv/bin/python bench/detector.py            # 300 px, batch 4 and 8, 2 warm-up + 12 measured steps
    .venv/bin/python bench/detector.py --quick    # ssdlite_small (96 px), batch 4, 1 + 2 steps (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (  # noqa: E402
    BOARD_VENV,
    board_env,
    install_job,
    json_run,
    physical_cores,
    run_agent,
    table,
    tiled_npz,
    write_results,
)
from tasks.paths import PROJECT_ROOT, state_dir  # noqa: E402

FULL = ("ssdlite_mobilenet_v2.toml", (4, 8), 2, 12)  # recipe, batch sizes, warm-up steps, measured steps
QUICK = ("ssdlite_small.toml", (4,), 1, 2)
TOLERANCE = 0.15
SPEED_COLUMNS = [("batch_size", "batch"), ("agent_samples_per_s", "agent s/s"), ("bare_samples_per_s", "bare ORT s/s"),
                 ("torch_samples_per_s", "torch s/s"), ("agent_vs_bare", "agent/bare"), ("agent_vs_torch", "agent/torch"),
                 ("agent_peak_rss_mb", "agent MB"), ("bare_peak_rss_mb", "bare ORT MB"), ("torch_peak_rss_mb", "torch MB"),
                 ("agent_vs_bare_rss", "agent/bare MB"), ("agent_vs_torch_rss", "agent/torch MB")]  # fmt: skip
MEMORY_COLUMNS = [("batch_size", "batch"), ("estimate_mb", "estimate MB"), ("probe_peak_mb", "probe MB"),
                  ("agent_peak_rss_mb", "agent MB"), ("estimate_ratio", "estimate/agent"),
                  ("within_target", "within 15%"), ("validation", "validation")]  # fmt: skip

# Bare ORT: the agent's step without the agent (no job dir, events, guards or checkpoints).
BARE_LOOP = r"""
import json, sys, time
import numpy as np
from device_agent.ort import load_training_api
from device_agent.data.readers import epoch_permutation, load_npz_arrays
from device_agent.sysinfo import peak_rss_mb
api = load_training_api()
a = json.loads(sys.argv[1])
state = api.CheckpointState.load_checkpoint(a["checkpoint"])
module = api.Module(a["training_model"], state, a["eval_model"])
opt = api.Optimizer(a["optimizer_model"], module)
data = load_npz_arrays(a["train"], "train")
arrays = [data[a["feeds"][n]] for n in module.input_names()]
bs, warmup, steps = a["batch_size"], a["warmup"], a["steps"]
order = epoch_permutation(a["seed"], 0, len(arrays[0]))
module.train()
losses = []
for step in range(warmup + steps):
    if step == warmup:
        t0 = time.perf_counter()
    idx = order[step * bs:(step + 1) * bs]
    opt.set_learning_rate(a["lrs"][step])
    out = module(*[np.ascontiguousarray(arr[idx]) for arr in arrays])
    opt.step()
    module.lazy_reset_grad()
    losses.append(float(np.asarray(out[0] if isinstance(out, (tuple, list)) else out).reshape(-1)[0]))
dt = time.perf_counter() - t0
print(json.dumps({"samples_per_s": steps * bs / dt, "seconds": dt, "peak_rss_mb": peak_rss_mb(),
                  "losses": losses, "torch_loaded": bool(sys.modules.get("torch"))}))
"""

TORCH_LOOP = r"""
import json, sys, time
import torch
from device_agent.data.readers import epoch_permutation, load_npz_arrays
from device_agent.sysinfo import peak_rss_mb
from tasks.prepare.export.torch_model import build_model
from tasks.recipe.load import load_recipe
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
model = build_model(load_recipe(a["recipe"]))
state = model.state_dict()
state.update(torch.load(a["weights"], map_location="cpu", weights_only=True))
model.load_state_dict(state)
model.train()
if a["batchnorm"] == "frozen":  # normalise with the running statistics, as the training graph does
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()
params = dict(model.named_parameters())
missing = [n for n in a["trainable"] if n not in params]
if missing:
    sys.exit(f"trainable tensors without a PyTorch parameter of the same name: {missing[:4]}")
for name, p in params.items():
    p.requires_grad_(name in a["trainable"])
opt = torch.optim.AdamW([params[n] for n in a["trainable"]], lr=a["lrs"][0], weight_decay=a["weight_decay"])
data = load_npz_arrays(a["train"], "train")
arrays = [data[a["feeds"][n]] for n in a["inputs"]]
bs, warmup, steps = a["batch_size"], a["warmup"], a["steps"]
order = epoch_permutation(a["seed"], 0, len(arrays[0]))
losses = []
for step in range(warmup + steps):
    if step == warmup:
        t0 = time.perf_counter()
    idx = order[step * bs:(step + 1) * bs]
    for group in opt.param_groups:
        group["lr"] = a["lrs"][step]
    loss = model(*[torch.from_numpy(arr[idx]) for arr in arrays])[0]
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(float(loss))
dt = time.perf_counter() - t0
print(json.dumps({"samples_per_s": steps * bs / dt, "seconds": dt, "peak_rss_mb": peak_rss_mb(),
                  "threads": torch.get_num_threads(), "losses": losses}))
"""


# the ORT-training runtime (the default is autograd): the bare loop is ONNX Runtime's training API
ORT = {"training.runtime": "ort-training"}


def prepare_once(recipe_file: str) -> tuple[Any, Path]:
    """Export + artifacts of the recipe (no validation), and its exported weights as a torch
    state_dict file (``torch_weights.pt``), so the torch loop starts from the board's weights."""
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(PROJECT_ROOT / "recipes" / recipe_file, ORT)
    prepared = prepare(recipe, state_dir("cache", "bench", f"detector-{recipe.name}"), validate=False)
    return prepared, torch_weights(recipe, prepared)


def torch_weights(recipe: Any, prepared: Any) -> Path:
    """The exported model's initializers under the PyTorch state_dict names they carry: every
    tensor of the state_dict but BatchNorm's ``num_batches_tracked`` counters must be one."""
    import onnx
    import torch
    from onnx import numpy_helper

    from tasks.prepare.export.torch_model import build_model

    own = build_model(recipe).state_dict()
    exported = {i.name: i for i in onnx.load(str(prepared.model_onnx)).graph.initializer}
    state = {k: torch.from_numpy(numpy_helper.to_array(exported[k]).copy()) for k in own if k in exported}
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    if missing:
        raise SystemExit(f"state_dict tensors {missing[:4]} are not initializers of {prepared.model_onnx}")
    path = prepared.out_dir / "torch_weights.pt"
    torch.save(state, path)
    return path


def tiled_train(path: Path, rows: int, root: Path) -> Path:
    """The train set repeated to ``rows`` samples (an uncompressed blob, memory-mapped by the
    agent and both loops), also reachable as ``root/train-<rows>.npz`` for the recipe's data.train."""
    ref = tiled_npz(path, rows, root)
    link = root / f"train-{rows}.npz"
    link.unlink(missing_ok=True)
    os.link(root / "blobs" / ref.blob.sha256, link)
    return link


def validation_report(recipe: Any, prepared: Any) -> dict[str, Any]:
    """bench/memory.py's: validation at the recipe's batch size (the estimate of its probe when
    only 'loss falls on a repeated batch' fails)."""
    from bench.memory import validation_report as report

    return report(recipe, prepared)


def agent_run(python: Path, root: Path, spec: Any, files: dict[str, Path], warmup: int) -> dict[str, Any]:
    """Run the agent; samples/s from the step event of the last warm-up step to the last step event."""
    from device_agent.job.events import read_events

    jdir = install_job(root, spec, files)
    result = run_agent(python, root, jdir)
    events = read_events(jdir / "events.jsonl")
    steps = [(e.get("data") or e) | {"ts": e["ts"]} for e in events if e["type"] == "step"]
    if warmup:
        start = next(s["ts"] for s in steps if s["step"] == warmup)
    else:
        start = next(e["ts"] for e in events if e["type"] == "started")
    measured = steps[-1]["step"] - warmup
    return {
        "samples_per_s": measured * spec.train.batch_size / (steps[-1]["ts"] - start),
        "peak_rss_mb": float(result["peak_rss_mb"]),
        "losses": [float(s["loss"]) for s in steps],
        "steps": result["steps"],
    }


def measure_batch(
    recipe_file: str,
    prepared: Any,
    weights: Path,
    batch: int,
    warmup: int,
    steps: int,
    repeats: int,
    python: Path,
) -> dict[str, Any]:
    """The three loops at one batch size (interleaved, best of ``repeats``) and validation's estimate."""
    from device_agent.job.schedule import lr_at
    from tasks.prepare.board_job import build_job_spec
    from tasks.recipe.load import load_recipe

    path, total = PROJECT_ROOT / "recipes" / recipe_file, warmup + steps
    root = state_dir("cache", "bench", "detector-root")
    data = tiled_train(load_recipe(path).data.train, total * batch, root)
    # validation estimates the job the loops run: this batch size, on the tiled set (its probe
    # holds the whole set in RAM; one epoch of the agent maps every row of it)
    overrides = {"training.batch_size": batch, "training.epochs": 1, "data.train": str(data), **ORT}
    recipe = load_recipe(path, overrides)
    report = validation_report(recipe, prepared)
    spec, files = build_job_spec(
        recipe, replace(prepared, validation=report), f"bench-detector-b{batch}", max_steps=total
    )
    params = replace(spec.train, epochs=1, checkpoint_every=0, log_every=1)
    spec = replace(spec, eval_data=None, train=params)
    common = {"train": str(data), "feeds": spec.feeds, "batch_size": batch, "warmup": warmup, "steps": steps,
              "seed": spec.train.seed, "lrs": [lr_at(s, total, spec.train) for s in range(total)]}  # fmt: skip
    bare_args = {**common, **{k: str(root / "blobs" / ref.sha256) for k, ref in spec.artifacts.items()}}
    torch_args = {**common, "recipe": str(path), "weights": str(weights), "inputs": list(recipe.model.input_names),
                  "trainable": prepared.manifest["trainable"], "batchnorm": prepared.manifest.get("batchnorm", "frozen"),
                  "weight_decay": recipe.optimizer.weight_decay, "threads": physical_cores()}  # fmt: skip
    agents, bares, torches = [], [], []
    for _ in range(repeats):
        agents.append(agent_run(python, root, spec, files, warmup))
        bares.append(json_run([str(python), "-c", BARE_LOOP, json.dumps(bare_args)], env=board_env()))
        torches.append(json_run([sys.executable, "-c", TORCH_LOOP, json.dumps(torch_args)]))
    agent, bare, torch_ = (max(runs, key=lambda r: r["samples_per_s"]) for runs in (agents, bares, torches))
    estimate, measured = float(report["board_peak_estimate_mb"]), agent["peak_rss_mb"]
    return {
        "recipe": recipe.name, "batch_size": batch, "warmup_steps": warmup, "steps": steps,
        "agent_steps": agent["steps"], "threads": torch_args["threads"], "torch_threads": torch_["threads"],
        "trainable_tensors": len(torch_args["trainable"]), "batchnorm": torch_args["batchnorm"],
        "agent_samples_per_s": round(agent["samples_per_s"], 2),
        "bare_samples_per_s": round(bare["samples_per_s"], 2),
        "torch_samples_per_s": round(torch_["samples_per_s"], 2),
        "agent_vs_bare": round(agent["samples_per_s"] / bare["samples_per_s"], 3),
        "agent_vs_torch": round(agent["samples_per_s"] / torch_["samples_per_s"], 3),
        "agent_peak_rss_mb": round(measured, 1), "bare_peak_rss_mb": round(bare["peak_rss_mb"], 1),
        "torch_peak_rss_mb": round(torch_["peak_rss_mb"], 1),
        "agent_vs_bare_rss": round(measured / bare["peak_rss_mb"], 3),
        "agent_vs_torch_rss": round(measured / torch_["peak_rss_mb"], 3),
        "bare_torch_loaded": bare["torch_loaded"],
        "first_loss": {"agent": agent["losses"][0], "bare": bare["losses"][0], "torch": torch_["losses"][0]},
        "last_loss": {"agent": agent["losses"][-1], "bare": bare["losses"][-1], "torch": torch_["losses"][-1]},
        "estimate_mb": round(estimate, 1), "probe_peak_mb": round(float(report["measured_peak_rss_mb"]), 1),
        "estimate_ratio": round(estimate / measured, 3),
        "within_target": abs(estimate / measured - 1) <= TOLERANCE,
        "validation": "passed" if report["passed"] else f"failed {report['failed_check']} (probe's estimate)",
    }  # fmt: skip


def main() -> int:
    """Prepare once, measure each batch size, print the tables, write bench/results/detector.json."""
    from tasks.vboard.venv import ensure_board_venv

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="ssdlite_small (96 px), batch 4, 1 + 2 steps")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs per loop, best counts")
    parser.add_argument("--out", type=Path, help="result file (default bench/results/detector.json)")
    args = parser.parse_args()
    recipe_file, batches, warmup, steps = QUICK if args.quick else FULL
    python = ensure_board_venv(BOARD_VENV)
    prepared, weights = prepare_once(recipe_file)
    rows = [
        measure_batch(recipe_file, prepared, weights, b, warmup, steps, args.repeats, python) for b in batches
    ]
    figures = {
        "recipe": recipe_file,
        "quick": args.quick,
        "repeats": args.repeats,
        "tolerance": TOLERANCE,
        "rows": rows,
    }
    path = write_results("detector", figures, args.out)
    print(f"{rows[0]['recipe']}: {warmup} warm-up + {steps} measured steps per loop, best of {args.repeats}")
    print(table(rows, SPEED_COLUMNS))
    print()
    print(table(rows, MEMORY_COLUMNS))
    for r in rows:
        losses = ", ".join(f"{k} {v:.5g}" for k, v in r["first_loss"].items())
        flag = "" if r["within_target"] else f"  ** OUTSIDE +-{TOLERANCE:.0%} **"
        print(
            f"batch {r['batch_size']}: first-step loss {losses}; estimate/agent {r['estimate_ratio']}{flag}"
        )
    print(f"threads: {rows[0]['threads']} (ORT default intra-op = physical cores; torch.set_num_threads)")
    print(f"target: estimate within +-{TOLERANCE:.0%} of the agent's measured peak RSS; figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
