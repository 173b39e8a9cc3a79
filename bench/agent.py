"""Agent overhead: the device agent's samples/s and peak RSS beside a bare ORT training loop.

For each recipe (digits, mobilenet_v2): prepare it (tasks.prepare, cached), run the agent on a
job of ``--steps`` steps (no eval set) in the torch-free board venv, and run a bare ORT loop over
the same artifacts, batches and step count in its own torch-free subprocess of the same venv.
Prints ratios (targets: throughput >= 0.98, RSS <= +50 MB) and writes bench/results/agent.json.

The bare loop is the least a user's own loop must do: take the epoch's shuffled rows; when the
job has a frozen prefix, run it on them in the first epoch and keep its outputs for the next
ones, as the agent does; set the learning rate, train, step, reset the gradients (it does not
read the loss). Both loops are timed over the same steps: from the agent's first step event of
the last epoch (step ``log_every`` with one epoch) to the end of the last step, so ORT's
first-step set-up, the agent's ``started`` fsync and its epoch-end checkpoints are outside both.
With ``--epochs 2`` a prefix job's timed epoch reads its cached prefix outputs (the steady state);
with one epoch every step also runs the prefix.

    .venv/bin/python bench/agent.py [--steps-digits 1000] [--steps-mobilenet 24] [--repeats 5]
    .venv/bin/python bench/agent.py --steps-mobilenet 0 --prefix-cache off   # digits, full graph
    .venv/bin/python bench/agent.py --steps-mobilenet 0 --epochs 2   # timed: the 2nd of 2 epochs
    .venv/bin/python bench/agent.py --quick    # digits, 100 steps, 2 pairs (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (  # noqa: E402
    BOARD_VENV,
    board_env,
    install_job,
    json_run,
    median_range,
    run_agent,
    spread,
    table,
    tiled_npz,
    write_results,
)
from tasks.paths import PROJECT_ROOT, state_dir  # noqa: E402

REPEATS = 5
BARE_LOOP = r"""
import json, sys, time
import numpy as np
from device_agent.ort import load_onnxruntime, load_training_api
from device_agent.data.readers import epoch_permutation, steps_per_epoch
api = load_training_api()
a = json.loads(sys.argv[1])
state = api.CheckpointState.load_checkpoint(a["checkpoint"])
module = api.Module(a["training_model"], state, a["eval_model"])
opt = api.Optimizer(a["optimizer_model"], module)
names = list(module.input_names())
prefix, cut = None, None
data_names = names
if a["prefix"]:
    prefix = load_onnxruntime().InferenceSession(a["prefix"]["model"], providers=["CPUExecutionProvider"])
    cut = a["prefix"]["output"]
    data_names = a["prefix"]["inputs"] + [n for n in names if n != cut]
feeds = a["feeds"] or dict(zip(data_names, ("x", "y")))
data = np.load(a["train"])
arrays = {n: data[feeds[n]] for n in data_names}
n, bs, steps, warm = len(arrays[data_names[0]]), a["batch_size"], a["steps"], a["warm"]
spe = steps_per_epoch(n, bs, False)
dtypes = {cut: np.float32} if prefix is not None else {}
module.train()
perms, cache = {}, None
for step in range(steps):
    if step == warm:
        t0 = time.perf_counter()
    epoch, pos = divmod(step, spe)
    if epoch not in perms:
        perms = {epoch: epoch_permutation(a["seed"], epoch, n)}
    idx = perms[epoch][pos * bs:(pos + 1) * bs]
    rows = {k: arr[idx] for k, arr in arrays.items()}
    if prefix is not None and epoch == 0:  # the prefix once per sample, its outputs kept
        out = prefix.run([cut], {k: rows[k] for k in a["prefix"]["inputs"]})[0]
        if cache is None:
            cache = np.empty((n, *out.shape[1:]), dtype=a["prefix"]["dtype"])
        cache[idx] = out
        rows[cut] = out
    elif prefix is not None:
        rows[cut] = cache[idx]
    batch = [np.ascontiguousarray(rows[k], dtype=dtypes.get(k)) for k in names]
    opt.set_learning_rate(a["lr"])
    loss = module(*batch)
    opt.step()
    module.lazy_reset_grad()
dt = time.perf_counter() - t0
from device_agent.sysinfo import peak_rss_mb
print(json.dumps({"samples_per_s": (steps - warm) * bs / dt, "seconds": dt, "peak_rss_mb": peak_rss_mb(),
                  "torch_loaded": bool(sys.modules.get("torch"))}))
"""


def make_job(
    recipe_file: str, steps: int, prefix_cache: str, epochs: int = 1
) -> tuple[object, dict, Path, dict]:
    """The bench job of ``recipe_file`` (``steps`` steps in ``epochs`` epochs over its tiled train
    set, no eval set, no intermediate checkpoint): its spec, files, agent root and the bare loop's
    args. Both loops are timed from the last epoch's first step event (``warm``) to the end."""
    from tasks.prepare.board_job import build_job_spec
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    # the ORT-training runtime: the bare loop beside the agent is ONNX Runtime's training API
    recipe = load_recipe(PROJECT_ROOT / "recipes" / recipe_file, {"training.runtime": "ort-training"})
    recipe = replace(recipe, training=replace(recipe.training, prefix_cache=prefix_cache))
    prepared = prepare(
        recipe, state_dir("cache", "bench", f"{recipe.name}-prefix-{prefix_cache}"), validate=False
    )
    spec, files = build_job_spec(recipe, prepared, f"bench-{recipe.name}", max_steps=steps)
    root = state_dir("cache", "bench", "agent-root")
    spe = -(-steps // epochs)
    train = tiled_npz(recipe.data.train, spe * spec.train.batch_size, root)
    files[train.blob.sha256] = root / "blobs" / train.blob.sha256
    spec = replace(
        spec, eval_data=None, train_data=train, train=replace(spec.train, epochs=epochs, checkpoint_every=0)
    )
    blob = lambda ref: str(root / "blobs" / ref.sha256)  # noqa: E731
    prefix = spec.prefix and {"model": blob(spec.prefix.model), "inputs": list(spec.prefix.inputs),
                              "output": spec.prefix.output, "dtype": spec.prefix.dtype}  # fmt: skip
    every = spec.train.log_every
    warm = ((epochs - 1) * spe // every + 1) * every  # the step of the last epoch's first step event
    args = {**{k: blob(ref) for k, ref in spec.artifacts.items()}, "train": blob(train.blob), "feeds": spec.feeds,
            "batch_size": spec.train.batch_size, "steps": steps, "warm": warm, "seed": spec.train.seed,
            "lr": spec.train.lr, "prefix": prefix}  # fmt: skip
    return spec, files, root, args


def bench_recipe(
    recipe_file: str, steps: int, python: Path, repeats: int, prefix_cache: str, epochs: int
) -> dict:
    """Agent vs bare loop on one recipe; returns the figures."""
    spec, files, root, args = make_job(recipe_file, steps, prefix_cache, epochs)
    agents, bares = [], []
    for _ in range(repeats):  # interleaved pairs: the machine is shared and noisy
        jdir = install_job(root, spec, files)
        agents.append(_agent_run(python, root, jdir, args["warm"]))
        bares.append(json_run([str(python), "-c", BARE_LOOP, json.dumps(args)], env=board_env()))
    agent = sorted(agents, key=lambda r: r["samples_per_s"])[len(agents) // 2]  # the median run
    bare = sorted(bares, key=lambda r: r["samples_per_s"])[len(bares) // 2]
    ratio = spread([a["samples_per_s"] / b["samples_per_s"] for a, b in zip(agents, bares, strict=True)])
    rss = spread([a["peak_rss_mb"] - b["peak_rss_mb"] for a, b in zip(agents, bares, strict=True)], 1)
    return {
        "recipe": spec.recipe_name, "prefix": bool(spec.prefix), "steps": steps, "epochs": epochs, "batch_size": spec.train.batch_size,
        "pairs": repeats,
        "agent_samples_per_s": spread([a["samples_per_s"] for a in agents], 1)["median"],
        "bare_samples_per_s": spread([b["samples_per_s"] for b in bares], 1)["median"],
        "throughput_ratio": ratio, "throughput_ratio_text": median_range(ratio),
        "agent_peak_rss_mb": agent["peak_rss_mb"], "bare_peak_rss_mb": round(bare["peak_rss_mb"], 1),
        "rss_delta_mb": rss, "rss_delta_text": median_range(rss),
        "agent_in_ort_fraction": agent["in_ort_fraction"],
        "agent_wall_s": agent["wall_s"], "epoch_end_checkpoint_ms": agent["checkpoint_ms"],
        "torch_loaded": bare["torch_loaded"],
    }  # fmt: skip


def _agent_run(python: Path, root: Path, jdir: Path, warm: int) -> dict:
    """Run the agent; samples/s from its step event ``warm`` to its last (the bare loop's window)."""
    from device_agent.job.events import read_events

    result = run_agent(python, root, jdir)
    spec = json.loads((jdir / "job.json").read_text())
    events = read_events(jdir / "events.jsonl")
    steps = [e for e in events if e["type"] == "step"]
    first, last = next(e for e in steps if e["data"]["step"] == warm), steps[-1]
    wall = last["ts"] - first["ts"]
    samples = (last["data"]["step"] - first["data"]["step"]) * spec["train"]["batch_size"]
    epoch_ts = [e["ts"] for e in events if e["type"] == "epoch"]
    ckpt_ts = [e["ts"] for e in events if e["type"] == "checkpoint"]
    start = next(e["ts"] for e in events if e["type"] == "started")
    return {
        "samples_per_s": samples / wall,
        "peak_rss_mb": result["peak_rss_mb"],
        "wall_s": round(wall, 3),
        "checkpoint_ms": round(1000 * (ckpt_ts[-1] - epoch_ts[-1]), 1),
        "in_ort_fraction": round(result["train_loop_s"] / (last["ts"] - start), 3),
    }


COLUMNS = [
    ("recipe", "recipe"), ("prefix", "prefix"), ("steps", "steps"), ("epochs", "epochs"), ("agent_samples_per_s", "agent samples/s"),
    ("bare_samples_per_s", "bare samples/s"), ("throughput_ratio_text", "agent/bare (median, range)"),
    ("agent_peak_rss_mb", "agent MB"), ("bare_peak_rss_mb", "bare MB"), ("rss_delta_text", "+MB (median, range)"),
    ("agent_in_ort_fraction", "in-ORT share"), ("epoch_end_checkpoint_ms", "ckpt ms"),
]  # fmt: skip


def main() -> int:
    """Run both recipes, print a table of ratios, write bench/results/agent.json."""
    from tasks.vboard.venv import ensure_board_venv

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps-digits", type=int, default=1000, help="0 skips digits")
    parser.add_argument("--steps-mobilenet", type=int, default=24, help="0 skips mobilenet_v2")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="interleaved agent/bare pairs")
    parser.add_argument("--prefix-cache", choices=("auto", "off"), default="auto",
                        help="the recipes' training.prefix_cache (off: train the full graph)")  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true", help="digits only, 100 steps, 1 pair (the smoke test)"
    )
    parser.add_argument(
        "--epochs", type=int, default=1, help="timed: the last one (2: prefix outputs cached)"
    )
    parser.add_argument("--out", type=Path, help="result file (default bench/results/agent.json)")
    args = parser.parse_args()
    if args.quick:
        args.steps_digits, args.steps_mobilenet, args.repeats = 100, 0, 2
    python = ensure_board_venv(BOARD_VENV)
    runs = (("digits.toml", args.steps_digits), ("mobilenet_v2.toml", args.steps_mobilenet))
    rows = [
        bench_recipe(recipe, steps, python, args.repeats, args.prefix_cache, args.epochs)
        for recipe, steps in runs
        if steps
    ]
    print(table(rows, COLUMNS))
    print(
        f"{args.repeats} interleaved agent/bare pairs: each ratio is the median of the per-pair ratios, with"
    )
    print(
        "their range; samples/s are medians. targets: ratio >= 0.98, +MB <= 50. in-ORT share: the fraction of the"
    )
    print(
        "agent's loop wall time spent inside ORT calls (one process, so immune to the noise between processes)."
    )
    print(f"written to {write_results('agent', {'rows': rows, 'pairs': args.repeats}, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
