"""On-board training throughput and peak RSS: the device agent vs an equivalent PyTorch CPU loop.

For digits and mobilenet_v2: the agent trains ``--steps`` steps of one epoch (the recipe's train
set tiled, no eval set, no intermediate checkpoint) in the torch-free board venv; a PyTorch loop
in its own process of the host venv trains the same model (same weights file), the same
trainable parameters (the manifest's list), the same loss, AdamW with the same lr and weight
decay, the same batch size, the same memory-mapped batches in the same order, with
``torch.set_num_threads`` equal to ONNX Runtime's default intra-op pool (the physical cores).
Prints samples/s and peak RSS (VmHWM) of both and their ratios; writes bench/results/train.json.

    .venv/bin/python bench/train.py            # digits 600 steps, mobilenet_v2 32 steps
    .venv/bin/python bench/train.py --quick    # digits only, 100 steps (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (  # noqa: E402
    BOARD_VENV,
    install_job,
    json_run,
    physical_cores,
    run_agent,
    table,
    tiled_npz,
    write_results,
)
from tasks.paths import PROJECT_ROOT, state_dir  # noqa: E402

REPEATS = 2  # interleaved, best of N: the machine is shared
COLUMNS = [("recipe", "recipe"), ("batch_size", "batch"), ("agent_samples_per_s", "agent s/s"),
           ("torch_samples_per_s", "torch s/s"), ("throughput_ratio", "agent/torch"),
           ("agent_peak_rss_mb", "agent MB"), ("torch_peak_rss_mb", "torch MB"), ("rss_ratio", "agent/torch MB")]  # fmt: skip
TORCH_LOOP = r"""
import json, sys, time
import torch
from device_agent.data import epoch_permutation, load_npz_arrays
from device_agent.sysinfo import peak_rss_mb
from tasks.prepare.torch_model import build_model
from tasks.recipe.load import load_recipe
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
recipe = load_recipe(a["recipe"])
model = build_model(recipe).train()
params = dict(model.named_parameters())
for name, p in params.items():
    p.requires_grad_(name in a["trainable"])
opt = torch.optim.AdamW([params[n] for n in a["trainable"]], lr=recipe.optimizer.lr,
                        weight_decay=recipe.optimizer.weight_decay)
loss_fn = torch.nn.CrossEntropyLoss()
data = load_npz_arrays(a["train"], "train")
x_all, y_all = data[a["x"]], data[a["y"]]
bs, steps = a["batch_size"], a["steps"]
order = epoch_permutation(a["seed"], 0, len(x_all))
t0 = time.perf_counter()
for step in range(steps):
    idx = order[step * bs:(step + 1) * bs]
    x = torch.from_numpy(x_all[idx])
    y = torch.from_numpy(y_all[idx].astype("int64"))
    loss = loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
dt = time.perf_counter() - t0
print(json.dumps({"samples_per_s": steps * bs / dt, "seconds": dt, "peak_rss_mb": peak_rss_mb(),
                  "threads": torch.get_num_threads(), "loss": float(loss)}))
"""


def agent_job(recipe_file: str, steps: int) -> tuple[Any, dict[str, Path], Path, Any]:
    """Prepare the recipe (cached) and build a one-epoch job of ``steps`` steps on tiled data."""
    from tasks.prepare import prepare
    from tasks.prepare.board_job import build_job_spec
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(PROJECT_ROOT / "recipes" / recipe_file)
    if recipe.loss.kind != "cross-entropy":
        raise SystemExit(f"{recipe_file}: the torch loop here only knows cross-entropy")
    prepared = prepare(recipe, state_dir("cache", "bench", f"train-{recipe.name}"), validate=False)
    spec, files = build_job_spec(recipe, prepared, f"bench-train-{recipe.name}", max_steps=steps)
    root = state_dir("cache", "bench", "train-root")
    train = tiled_npz(recipe.data.train, steps * spec.train.batch_size, root)
    files[train.blob.sha256] = root / "blobs" / train.blob.sha256
    params = replace(spec.train, epochs=1, checkpoint_every=0, log_every=1)
    return replace(spec, train_data=train, eval_data=None, train=params), files, root, prepared


def agent_throughput(python: Path, root: Path, spec: Any, files: dict[str, Path]) -> dict[str, float]:
    """Run the agent; samples/s from the 'started' event to the last step event, and its peak RSS."""
    from device_agent.events import read_events

    jdir = install_job(root, spec, files)
    result = run_agent(python, root, jdir)
    events = read_events(jdir / "events.jsonl")
    start = next(e["ts"] for e in events if e["type"] == "started")
    last = [e for e in events if e["type"] == "step"][-1]
    step = (last.get("data") or last)["step"]
    return {
        "samples_per_s": step * spec.train.batch_size / (last["ts"] - start),
        "peak_rss_mb": result["peak_rss_mb"],
    }


def bench_recipe(recipe_file: str, steps: int, python: Path) -> dict[str, Any]:
    """Agent vs torch loop on one recipe (interleaved, best of REPEATS)."""
    spec, files, root, prepared = agent_job(recipe_file, steps)
    feeds = spec.feeds
    names = list(feeds) if feeds else ["x", "y"]
    args = {"recipe": str(PROJECT_ROOT / "recipes" / recipe_file), "trainable": prepared.manifest["trainable"],
            "train": str(root / "blobs" / spec.train_data.blob.sha256), "x": feeds.get(names[0], "x"),
            "y": feeds.get(names[1], "y") if len(names) > 1 else "y", "batch_size": spec.train.batch_size,
            "steps": steps, "seed": spec.train.seed, "threads": physical_cores()}  # fmt: skip
    agents, torches = [], []
    for _ in range(REPEATS):
        agents.append(agent_throughput(python, root, spec, files))
        torches.append(json_run([sys.executable, "-c", TORCH_LOOP, json.dumps(args)]))
    agent = max(agents, key=lambda r: r["samples_per_s"])
    torch_ = max(torches, key=lambda r: r["samples_per_s"])
    return {
        "recipe": spec.recipe_name, "batch_size": spec.train.batch_size, "steps": steps,
        "threads": args["threads"], "torch_threads": torch_["threads"],
        "trainable_tensors": len(args["trainable"]),
        "agent_samples_per_s": round(agent["samples_per_s"], 1),
        "torch_samples_per_s": round(torch_["samples_per_s"], 1),
        "throughput_ratio": round(agent["samples_per_s"] / torch_["samples_per_s"], 3),
        "agent_peak_rss_mb": agent["peak_rss_mb"], "torch_peak_rss_mb": round(torch_["peak_rss_mb"], 1),
        "rss_ratio": round(agent["peak_rss_mb"] / torch_["peak_rss_mb"], 3),
    }  # fmt: skip


def main() -> int:
    """Run the recipes, print the table, write bench/results/train.json."""
    from tasks.vboard.venv import ensure_board_venv

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="digits only, 100 steps")
    parser.add_argument("--out", type=Path, help="result file (default bench/results/train.json)")
    args = parser.parse_args()
    python = ensure_board_venv(BOARD_VENV)
    plan = [("digits.toml", 100)] if args.quick else [("digits.toml", 600), ("mobilenet_v2.toml", 32)]
    rows = [bench_recipe(recipe, steps, python) for recipe, steps in plan]
    path = write_results("train", {"rows": rows, "quick": args.quick, "repeats": REPEATS}, args.out)
    print(table(rows, COLUMNS))
    print(f"threads: {rows[0]['threads']} (ORT default intra-op = physical cores; torch.set_num_threads)")
    print(f"figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
