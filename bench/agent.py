"""Agent overhead: the device agent's samples/s and peak RSS beside a bare ORT training loop.

For each recipe (digits, mobilenet_v2): prepare it (tasks.prepare, cached), run the agent on a
job of ``--steps`` steps (no eval set) in the torch-free board venv, and run a bare ORT loop over
the same artifacts, batches and step count in its own torch-free subprocess of the same venv.
Prints ratios (targets: throughput >= 0.95, RSS <= +50 MB) and writes bench/results/agent.json.

    .venv/bin/python bench/agent.py [--steps-digits 1000] [--steps-mobilenet 24]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (  # noqa: E402
    BOARD_VENV,
    board_env,
    install_job,
    json_run,
    run_agent,
    table,
    tiled_npz,
    write_results,
)
from tasks.paths import PROJECT_ROOT, state_dir  # noqa: E402

REPEATS = 5
BARE_LOOP = r"""
import json, sys, time
import numpy as np
from device_agent.ort import load_training_api
from device_agent.data import epoch_permutation, steps_per_epoch
api = load_training_api()
a = json.loads(sys.argv[1])
state = api.CheckpointState.load_checkpoint(a["checkpoint"])
module = api.Module(a["training_model"], state, a["eval_model"])
opt = api.Optimizer(a["optimizer_model"], module)
data = np.load(a["train"])
names = module.input_names()
arrays = [data[a["feeds"].get(n, k)] for n, k in zip(names, ("x", "y"))]
n, bs, steps = len(arrays[0]), a["batch_size"], a["steps"]
spe = steps_per_epoch(n, bs, False)
module.train()
t0 = time.perf_counter()
perms = {}
for step in range(steps):
    epoch, pos = divmod(step, spe)
    if epoch not in perms:
        perms = {epoch: epoch_permutation(a["seed"], epoch, n)}
    idx = perms[epoch][pos * bs:(pos + 1) * bs]
    batch = [np.ascontiguousarray(arr[idx]) for arr in arrays]
    opt.set_learning_rate(a["lr"])
    loss = module(*batch)
    opt.step()
    module.lazy_reset_grad()
dt = time.perf_counter() - t0
from device_agent.sysinfo import peak_rss_mb
print(json.dumps({"samples_per_s": steps * bs / dt, "seconds": dt, "peak_rss_mb": peak_rss_mb(),
                  "torch_loaded": bool(sys.modules.get("torch"))}))
"""


def bench_recipe(recipe_file: str, steps: int, python: Path) -> dict:
    """Agent vs bare loop on one recipe; returns the figures."""
    from tasks.prepare import prepare
    from tasks.prepare.board_job import build_job_spec
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(PROJECT_ROOT / "recipes" / recipe_file)
    prepared = prepare(recipe, state_dir("cache", "bench", recipe.name), validate=False)
    spec, files = build_job_spec(recipe, prepared, f"bench-{recipe.name}", max_steps=steps)
    root = state_dir("cache", "bench", "agent-root")
    train = tiled_npz(recipe.data.train, steps * spec.train.batch_size, root)
    files[train.blob.sha256] = root / "blobs" / train.blob.sha256
    spec = replace(
        spec, eval_data=None, train_data=train, train=replace(spec.train, epochs=1, checkpoint_every=0)
    )
    agents, bares = [], []
    blobs = {k: str(root / "blobs" / ref.sha256) for k, ref in spec.artifacts.items()}
    args = {**blobs, "train": str(root / "blobs" / spec.train_data.blob.sha256), "feeds": spec.feeds,
            "batch_size": spec.train.batch_size, "steps": steps, "seed": spec.train.seed, "lr": spec.train.lr}  # fmt: skip
    for _ in range(REPEATS):  # interleaved pairs: the machine is shared and noisy
        jdir = install_job(root, spec, files)
        agents.append(_agent_run(python, root, jdir))
        bares.append(json_run([str(python), "-c", BARE_LOOP, json.dumps(args)], env=board_env()))
    agent = max(agents, key=lambda r: r["samples_per_s"])
    bare = max(bares, key=lambda r: r["samples_per_s"])
    return {
        "recipe": recipe.name, "steps": steps, "batch_size": spec.train.batch_size,
        "agent_samples_per_s": round(agent["samples_per_s"], 1), "bare_samples_per_s": round(bare["samples_per_s"], 1),
        "throughput_ratio": round(agent["samples_per_s"] / bare["samples_per_s"], 3),
        "paired_ratio_median": round(statistics.median(a["samples_per_s"] / b["samples_per_s"] for a, b in zip(agents, bares, strict=True)), 3),
        "agent_peak_rss_mb": agent["peak_rss_mb"], "bare_peak_rss_mb": round(bare["peak_rss_mb"], 1),
        "rss_delta_mb": round(agent["peak_rss_mb"] - bare["peak_rss_mb"], 1),
        "agent_in_ort_fraction": agent["in_ort_fraction"],
        "agent_wall_s": agent["wall_s"], "epoch_end_checkpoint_ms": agent["checkpoint_ms"],
        "torch_loaded": bare["torch_loaded"],
    }  # fmt: skip


def _agent_run(python: Path, root: Path, jdir: Path) -> dict:
    """Run the agent; samples/s over the training loop wall time (first step -> last step event)."""
    from device_agent.events import read_events

    result = run_agent(python, root, jdir)
    spec = json.loads((jdir / "job.json").read_text())
    events = read_events(jdir / "events.jsonl")
    start = next(e["ts"] for e in events if e["type"] == "started")
    last = [e["ts"] for e in events if e["type"] == "step"][-1]
    samples = result["steps"] * spec["train"]["batch_size"]
    epoch_ts = [e["ts"] for e in events if e["type"] == "epoch"]
    ckpt_ts = [e["ts"] for e in events if e["type"] == "checkpoint"]
    return {
        "samples_per_s": samples / (last - start),
        "peak_rss_mb": result["peak_rss_mb"],
        "wall_s": round(last - start, 3),
        "checkpoint_ms": round(1000 * (ckpt_ts[-1] - epoch_ts[-1]), 1),
        "in_ort_fraction": round(result["train_loop_s"] / (last - start), 3),
    }


COLUMNS = [
    ("recipe", "recipe"), ("steps", "steps"), ("agent_samples_per_s", "agent samples/s"),
    ("bare_samples_per_s", "bare samples/s"), ("throughput_ratio", "best/best"),
    ("paired_ratio_median", "median pair"),
    ("agent_peak_rss_mb", "agent MB"), ("bare_peak_rss_mb", "bare MB"), ("rss_delta_mb", "+MB"),
    ("agent_in_ort_fraction", "in-ORT share"), ("epoch_end_checkpoint_ms", "ckpt ms"),
]  # fmt: skip


def main() -> int:
    """Run both recipes, print a table of ratios, write bench/results/agent.json."""
    from tasks.vboard.venv import ensure_board_venv

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps-digits", type=int, default=1000)
    parser.add_argument("--steps-mobilenet", type=int, default=24)
    args = parser.parse_args()
    python = ensure_board_venv(BOARD_VENV)
    rows = [bench_recipe("digits.toml", args.steps_digits, python),
            bench_recipe("mobilenet_v2.toml", args.steps_mobilenet, python)]  # fmt: skip
    print(table(rows, COLUMNS))
    print(
        f"{REPEATS} interleaved agent/bare pairs: best/best = best agent over best bare; median pair = median"
    )
    print(
        "of the per-pair ratios. targets: ratio >= 0.95, +MB <= 50. in-ORT share: the fraction of the agent's loop wall time"
    )
    print("spent inside ORT calls (one process, so immune to the noise between processes).")
    print(f"written to {write_results('agent', {'rows': rows, 'pairs': REPEATS})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
