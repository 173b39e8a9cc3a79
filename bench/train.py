"""On-board training throughput and peak RSS: the device agent vs an equivalent PyTorch CPU loop.

For digits and mobilenet_v2: the agent trains ``--steps`` steps of one epoch (the recipe's train
set tiled, no eval set, no intermediate checkpoint) in the torch-free board venv; a PyTorch loop
in its own process of the host venv trains the same model (same weights file), the same
trainable parameters (the manifest's list), the same loss, AdamW with the same lr and weight
decay, the same batch size, the same memory-mapped batches in the same order, with
``torch.set_num_threads`` equal to ONNX Runtime's default intra-op pool (the physical cores).
Both loops are timed from their ``WARMUP_STEPS``-th step (session start, first allocations and
caches stay out of the figure). The two run in ``--pairs`` interleaved pairs (order alternating);
each pair gives a ratio, and every ratio is reported as the median of the pairs with its range.
Prints samples/s and peak RSS (VmHWM) of both and their ratios; writes bench/results/train.json.

    .venv/bin/python bench/train.py            # digits 4000 steps, mobilenet_v2 40 steps, 5 pairs
    .venv/bin/python bench/train.py --quick    # digits only, 100 steps, 2 pairs (the smoke test)
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
    interleaved_pairs,
    json_run,
    median_range,
    physical_cores,
    run_agent,
    spread,
    table,
    tiled_npz,
    write_results,
)
from tasks.paths import PROJECT_ROOT, state_dir  # noqa: E402

PAIRS = 5  # interleaved (agent, torch) pairs; every ratio is their median, with its range
WARMUP_STEPS = 10  # steps of each loop left out of its timing
COLUMNS = [("recipe", "recipe"), ("batch_size", "batch"), ("steps", "steps"),
           ("agent_samples_per_s", "agent s/s"), ("torch_samples_per_s", "torch s/s"),
           ("throughput_ratio_text", "agent/torch (median, range)"), ("agent_peak_rss_mb", "agent MB"),
           ("torch_peak_rss_mb", "torch MB"), ("rss_ratio_text", "agent/torch MB")]  # fmt: skip
TORCH_LOOP = r"""
import json, sys, time
import torch
from device_agent.data.readers import epoch_permutation, load_npz_arrays
from device_agent.sysinfo import peak_rss_mb
from tasks.prepare.export.torch_model import build_model
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
bs, steps, warm = a["batch_size"], a["steps"], a["warmup"]
order = epoch_permutation(a["seed"], 0, len(x_all))
t0 = time.perf_counter()
for step in range(steps):
    if step == warm:
        t0 = time.perf_counter()
    idx = order[step * bs:(step + 1) * bs]
    x = torch.from_numpy(x_all[idx])
    y = torch.from_numpy(y_all[idx].astype("int64"))
    loss = loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
dt = time.perf_counter() - t0
print(json.dumps({"samples_per_s": (steps - warm) * bs / dt, "seconds": dt, "peak_rss_mb": peak_rss_mb(),
                  "threads": torch.get_num_threads(), "loss": float(loss)}))
"""


def prepared_recipe(recipe_file: str, prefix_cache: str) -> tuple[Any, Any]:
    """The recipe with ``training.prefix_cache`` set, prepared (cached per setting)."""
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(PROJECT_ROOT / "recipes" / recipe_file)
    recipe = replace(recipe, training=replace(recipe.training, prefix_cache=prefix_cache))
    if recipe.loss.kind != "cross-entropy":
        raise SystemExit(f"{recipe_file}: the torch loop here only knows cross-entropy")
    out = state_dir("cache", "bench", f"train-{recipe.name}-{prefix_cache}")
    return recipe, prepare(recipe, out, validate=False)


def agent_job(recipe_file: str, steps: int) -> tuple[Any, dict[str, Path], Path, Any]:
    """A one-epoch job of ``steps`` steps on tiled data, the full graph at every step (no prefix
    cache: one epoch is what the torch loop is compared with)."""
    from tasks.prepare.board_job import build_job_spec

    recipe, prepared = prepared_recipe(recipe_file, "off")
    spec, files = build_job_spec(recipe, prepared, f"bench-train-{recipe.name}", max_steps=steps)
    root = state_dir("cache", "bench", "train-root")
    train = tiled_npz(recipe.data.train, steps * spec.train.batch_size, root)
    files[train.blob.sha256] = root / "blobs" / train.blob.sha256
    params = replace(spec.train, epochs=1, checkpoint_every=0, log_every=1)
    return replace(spec, train_data=train, eval_data=None, train=params), files, root, prepared


def agent_throughput(python: Path, root: Path, spec: Any, files: dict[str, Path]) -> dict[str, float]:
    """Run the agent; samples/s from its ``WARMUP_STEPS``-th step event to the last, and its peak RSS."""
    from device_agent.job.events import read_events

    jdir = install_job(root, spec, files)
    result = run_agent(python, root, jdir)
    steps = [e for e in read_events(jdir / "events.jsonl") if e["type"] == "step"]
    first, last = steps[WARMUP_STEPS - 1], steps[-1]
    done = (last.get("data") or last)["step"] - (first.get("data") or first)["step"]
    return {
        "samples_per_s": done * spec.train.batch_size / (last["ts"] - first["ts"]),
        "peak_rss_mb": result["peak_rss_mb"],
    }


def bench_recipe(recipe_file: str, steps: int, python: Path, pairs: int) -> dict[str, Any]:
    """Agent vs torch loop on one recipe: ``pairs`` interleaved pairs, each pair's ratio, medians."""
    spec, files, root, prepared = agent_job(recipe_file, steps)
    feeds = spec.feeds
    names = list(feeds) if feeds else ["x", "y"]
    args = {"recipe": str(PROJECT_ROOT / "recipes" / recipe_file), "trainable": prepared.manifest["trainable"],
            "train": str(root / "blobs" / spec.train_data.blob.sha256), "x": feeds.get(names[0], "x"),
            "y": feeds.get(names[1], "y") if len(names) > 1 else "y", "batch_size": spec.train.batch_size,
            "steps": steps, "seed": spec.train.seed, "threads": physical_cores(), "warmup": WARMUP_STEPS}  # fmt: skip
    runs = interleaved_pairs(
        lambda: agent_throughput(python, root, spec, files),
        lambda: json_run([sys.executable, "-c", TORCH_LOOP, json.dumps(args)]),
        pairs,
    )
    speed = spread([a["samples_per_s"] / t["samples_per_s"] for a, t in runs])
    rss = spread([a["peak_rss_mb"] / t["peak_rss_mb"] for a, t in runs])
    return {
        "recipe": spec.recipe_name, "batch_size": spec.train.batch_size, "steps": steps,
        "threads": args["threads"], "torch_threads": runs[0][1]["threads"],
        "trainable_tensors": len(args["trainable"]), "pairs": pairs,
        "agent_samples_per_s": spread([a["samples_per_s"] for a, _ in runs], 1)["median"],
        "torch_samples_per_s": spread([t["samples_per_s"] for _, t in runs], 1)["median"],
        "throughput_ratio": speed, "throughput_ratio_text": median_range(speed),
        "agent_peak_rss_mb": spread([a["peak_rss_mb"] for a, _ in runs], 1)["median"],
        "torch_peak_rss_mb": spread([t["peak_rss_mb"] for _, t in runs], 1)["median"],
        "rss_ratio": rss, "rss_ratio_text": median_range(rss),
    }  # fmt: skip


CACHE_COLUMNS = [("mode", "mobilenet_v2"), ("epoch1_s", "epoch 1 s"), ("later_samples_per_s", "epochs 2+ s/s"),
                 ("speedup", "vs full graph"), ("peak_rss_mb", "peak MB")]  # fmt: skip


def cache_run(python: Path, recipe_file: str, mode: str, rows: int, epochs: int) -> dict[str, Any]:
    """``epochs`` epochs over ``rows`` samples with ``training.prefix_cache = mode``: the first
    epoch's seconds, the mean samples/s of the later ones (from the epoch events), peak RSS."""
    import statistics

    from device_agent.job.events import read_events
    from tasks.prepare.board_job import build_job_spec

    recipe, prepared = prepared_recipe(recipe_file, mode)
    spec, files = build_job_spec(recipe, prepared, f"bench-cache-{recipe.name}-{mode}")
    root = state_dir("cache", "bench", "train-root")
    train = tiled_npz(recipe.data.train, rows, root)
    files[train.blob.sha256] = root / "blobs" / train.blob.sha256
    params = replace(spec.train, epochs=epochs, checkpoint_every=0, log_every=1, max_steps=0)
    jdir = install_job(root, replace(spec, train_data=train, eval_data=None, train=params), files)
    result = run_agent(python, root, jdir)
    events = read_events(jdir / "events.jsonl")
    ends = [next(e["ts"] for e in events if e["type"] == "started")]
    ends += [e["ts"] for e in events if e["type"] == "epoch"]
    rates = [rows / (b - a) for a, b in zip(ends, ends[1:], strict=False)]
    cache = [e["data"] for e in events if e["type"] == "cache"]
    return {"mode": f"agent, prefix cache {mode}", "epoch1_s": round(ends[1] - ends[0], 2),
            "later_samples_per_s": round(statistics.mean(rates[1:]), 1), "peak_rss_mb": result["peak_rss_mb"],
            "cache": cache[0] if cache else None, "cut": prepared.manifest["prefix_cache"].get("cut")}  # fmt: skip


def bench_cache(python: Path, rows: int, epochs: int) -> list[dict[str, Any]]:
    """mobilenet_v2 last-conv+classifier at 224x224: the full graph at every step vs the frozen
    prefix run once per sample (epoch 1) and the suffix trained on its cached outputs, and the
    torch loop (full graph; no cache) beside them."""
    full = cache_run(python, "mobilenet_v2.toml", "off", rows, epochs)
    cached = cache_run(python, "mobilenet_v2.toml", "auto", rows, epochs)
    recipe, prepared = prepared_recipe("mobilenet_v2.toml", "off")
    root = state_dir("cache", "bench", "train-root")
    data = tiled_npz(recipe.data.train, rows, root)
    bs = recipe.training.batch_size
    args = {"recipe": str(PROJECT_ROOT / "recipes" / "mobilenet_v2.toml"), "trainable": prepared.manifest["trainable"],
            "train": str(root / "blobs" / data.blob.sha256), "x": "x", "y": "y", "batch_size": bs,
            "steps": rows // bs, "seed": recipe.training.seed, "threads": physical_cores(),
            "warmup": 0}  # fmt: skip  # the whole epoch, as the agent's epochs are timed
    torch_ = json_run([sys.executable, "-c", TORCH_LOOP, json.dumps(args)])
    torch_row = {"mode": "torch loop (full graph)", "epoch1_s": round(rows / torch_["samples_per_s"], 2),
                 "later_samples_per_s": round(torch_["samples_per_s"], 1),
                 "peak_rss_mb": round(torch_["peak_rss_mb"], 1)}  # fmt: skip
    rows_out = [full, cached, torch_row]
    for row in rows_out:
        row["speedup"] = round(row["later_samples_per_s"] / full["later_samples_per_s"], 2)
    return rows_out


def main() -> int:
    """Run the recipes, print the table, write bench/results/train.json."""
    from tasks.vboard.venv import ensure_board_venv

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="digits only, 100 steps, 2 pairs")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="interleaved agent/torch pairs per recipe")
    parser.add_argument("--out", type=Path, help="result file (default bench/results/train.json)")
    parser.add_argument("--cache-rows", type=int, default=128, help="samples of the prefix-cache comparison")
    parser.add_argument("--cache-epochs", type=int, default=3, help="its epochs (the first fills the cache)")
    args = parser.parse_args()
    python = ensure_board_venv(BOARD_VENV)
    plan = [("digits.toml", 100)] if args.quick else [("digits.toml", 4000), ("mobilenet_v2.toml", 40)]
    pairs = 2 if args.quick else args.pairs
    rows = [bench_recipe(recipe, steps, python, pairs) for recipe, steps in plan]
    cache = [] if args.quick else bench_cache(python, args.cache_rows, args.cache_epochs)
    results = {"rows": rows, "prefix_cache": cache, "quick": args.quick, "pairs": pairs}
    path = write_results("train", results, args.out)
    print(table(rows, COLUMNS))
    if cache:
        print(
            f"\nfrozen-prefix caching: {args.cache_rows} samples, {args.cache_epochs} epochs, cut at {cache[1]['cut']}"
        )
        print(table(cache, CACHE_COLUMNS))
    print(f"threads: {rows[0]['threads']} (ORT default intra-op = physical cores; torch.set_num_threads)")
    print(f"figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
