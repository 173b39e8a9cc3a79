"""The two training runtimes side by side: ``ort-training`` (ONNX Runtime's training artifacts) and
``autograd`` (PyTorch's autograd exported as a plain ONNX step, a numpy optimizer on the board).

For each reference recipe: the model is built once (torch seed 0) and its state_dict saved, so both
runtimes start from the same weights (a new head or a model without weights is random at each
build); BatchNorm statistics the recipe calibrates are already in that file (calibration off). The
recipe is then prepared twice (``training.runtime`` overridden, no validation, frozen-prefix cache
off so both train the whole graph), and each runtime's job runs ``--steps`` steps of one epoch
over the same batches (the recipe's train set tiled, or for a teacher recipe unlabeled shards the
board's teacher labels) with the device agent in the torch-free board venv, as on a board. The
autograd job runs in a process tree that cannot import ``onnxruntime.training`` (as
``tests/runtimes`` runs it). A recipe the autograd runtime refuses is a row with its one line.

Per recipe: the largest relative difference of the per-step losses, the largest absolute difference
of the final trainable weights (from the first pair); the same between the autograd job and itself
started from weights one ulp higher (how far float32 rounding alone carries the run, the scale the
runtimes' difference is judged by); the largest difference of the autograd step's gradients from
PyTorch's ``loss.backward()`` on one batch (relative to each gradient's largest value); and each
runtime's samples/s (from the ``WARMUP_STEPS``-th step event to the last) and peak RSS (VmHWM),
the medians of ``--pairs`` interleaved (ORT, autograd) pairs with their min-max range. A model with dropout has it turned off
by a recipe override (listed in the table): the two runtimes draw their masks from different
generators, so with dropout their losses differ by design. Writes bench/results/runtimes.json.

    .venv/bin/python bench/runtimes.py            # 6 recipes, 50 steps, 5 pairs
    .venv/bin/python bench/runtimes.py --quick    # digits, 1 pair (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (  # noqa: E402
    BOARD_VENV,
    board_env,
    install_job,
    interleaved_pairs,
    json_run,
    median_range,
    spread,
    table,
    tiled_npz,
    write_results,
)
from bench._runtime_checks import gradient_vs_torch, perturbed  # noqa: E402
from tasks.paths import PROJECT_ROOT, state_dir  # noqa: E402

RECIPES = ["digits.toml", "mobilenet_v2.toml", "two_head_custom_loss.toml", "embedded_loss.toml",
           "ssdlite_small.toml", "digits_teacher_soft.toml"]  # fmt: skip
# what turns a recipe's dropout off (its masks come from ORT's generator in one runtime and numpy's
# in the other): torchvision's mobilenet_v2 has Dropout(0.2) before its classifier
NO_DROPOUT: dict[str, dict[str, Any]] = {"mobilenet_v2.toml": {"model.kwargs": {"dropout": 0.0}}}
RUNTIMES = ("ort-training", "autograd")
STEPS = 50
PAIRS = 5
WARMUP_STEPS = 10  # step events before the timed window (session start, first allocations)
COLUMNS = [("recipe", "recipe"), ("batch_size", "batch"), ("steps", "steps"), ("dropout", "dropout"),
           ("loss_rel_text", "loss max rel diff"), ("weight_abs_text", "weights max abs diff"),
           ("ulp_loss_rel_text", "+1 ulp: loss"), ("ulp_weight_abs_text", "+1 ulp: weights"),
           ("grad_text", "gradients vs torch"),
           ("ort_sps_text", "ORT samples/s"), ("autograd_sps_text", "autograd samples/s"),
           ("ort_rss_text", "ORT MB"), ("autograd_rss_text", "autograd MB")]  # fmt: skip


def one_line(exc: BaseException) -> str:
    """An exception as one line: its class and the first line of its message."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"[:300]


def common_weights(recipe: Any, folder: Path) -> Path:
    """The recipe's model built once (torch seed 0, its weights and calibration applied) as a
    state_dict file both runtimes start from."""
    import torch

    from tasks.prepare.export.torch_model import build_model

    torch.manual_seed(0)
    path = folder / "weights.pt"
    torch.save(build_model(recipe).state_dict(), path)
    return path


def prepared_for(recipe_file: str, overrides: dict[str, Any], runtime: str) -> tuple[Any, Any]:
    """(Recipe, Prepared) of the recipe with ``overrides`` under ``runtime``, no validation, in the
    inputs' cached folder (``$ODL_HOME/prepared``)."""
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(PROJECT_ROOT / "recipes" / recipe_file, {**overrides, "training.runtime": runtime})
    return recipe, prepare(recipe, validate=False, cache=True)


def teacher_shards(recipe: Any, root: Path, rows: int) -> Any:
    """Unlabeled shards of ``rows`` samples (the recipe's board shards, tiled) in the agent root,
    which the board's teacher labels before training; their DataRef."""
    import numpy as np

    from device_agent.protocol import DataFile, DataRef, file_sha256

    shards = sorted((Path(recipe.teacher.model).parent / "shards").glob("*.npz"))
    x = np.concatenate([np.load(p)["x"] for p in shards])
    folder = root / "datasets" / "bench-runtimes"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "shard-0000.npz"
    with open(path, "wb") as fh:
        np.savez(fh, x=np.concatenate([x] * -(-rows // len(x)))[:rows])
    pin = DataFile(path.name, file_sha256(path), path.stat().st_size, rows)
    return DataRef("npz-shards", path="datasets/bench-runtimes", files=(pin,))


def jobs(recipe_file: str, steps: int, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both runtimes' job (spec, files) over the same data, and the row's facts; a refusal (either
    runtime's preparation failing) is ``({}, {"why": one line})``."""
    from tasks.recipe.load import load_recipe

    overrides = dict(NO_DROPOUT.get(recipe_file, {}))
    base = load_recipe(PROJECT_ROOT / "recipes" / recipe_file, overrides)
    facts: dict[str, Any] = {"recipe": base.name, "file": recipe_file, "steps": steps,
                             "batch_size": base.training.batch_size}  # fmt: skip
    from tasks.stages.prepare import prepare_data

    prepare_data(base)
    folder = state_dir("cache", "bench", "runtimes", base.name)
    overrides |= {"model.weights": str(common_weights(base, folder)), "training.prefix_cache": "off"}
    if base.trainable.batchnorm_calibration:
        overrides["trainable.batchnorm_calibration"] = 0  # the statistics are in the weights file
    facts["overrides"] = {k: v for k, v in overrides.items() if k != "model.weights"}
    out: dict[str, Any] = {}
    data = None
    for runtime in RUNTIMES:
        try:
            recipe, prepared = prepared_for(recipe_file, overrides, runtime)
        except Exception as exc:  # noqa: BLE001 - a refusal is the row's one line, whatever raised it
            return {}, {**facts, "why": f"{runtime}: {one_line(exc)}"}
        from tasks.prepare.board_job import build_job_spec

        if data is None:
            rows = steps * recipe.training.batch_size
            if recipe.data.board_dataset is not None:
                data = teacher_shards(recipe, root, 2 * rows)  # the teacher may leave samples out
            else:
                data = tiled_npz(recipe.data.train, rows, root)
        spec, files = build_job_spec(
            recipe, prepared, f"bench-runtimes-{recipe.name}-{runtime}", train_data=data
        )
        if data.blob is not None:
            files[data.blob.sha256] = root / "blobs" / data.blob.sha256
        params = replace(spec.train, epochs=1, max_steps=steps, checkpoint_every=0, log_every=1)
        out[runtime] = (replace(spec, eval_data=None, train=params), files, prepared)
    try:  # the autograd step's gradients against PyTorch's on one batch
        facts |= gradient_vs_torch(recipe, out["autograd"][2], recipe.training.batch_size)
    except Exception as exc:  # noqa: BLE001 - the row then says why instead of a figure
        facts["grad_text"] = one_line(exc)
    noise = json.loads((out["autograd"][2].artifacts_dir / "step.json").read_text()).get("noise")
    facts["dropout"] = ("off (override)" if recipe_file in NO_DROPOUT else "none") if not noise else "ON"
    facts["random_step_inputs"] = [n["name"] for n in noise or []]
    return out, facts


def run_job(
    python: Path, root: Path, spec: Any, files: dict[str, Path], env: dict[str, str]
) -> dict[str, Any]:
    """Run one job with the agent; its losses, trained tensors, samples/s and peak RSS."""
    import numpy as np

    from device_agent.job.events import read_events

    jdir = install_job(root, spec, files)
    argv = [str(python), "-m", "device_agent", "--root", str(root), "run", str(jdir)]
    result = json_run(argv, env=env)
    if result.get("status") != "finished":
        raise SystemExit(f"agent run of {jdir.name} did not finish: {result}")
    steps = [e for e in read_events(jdir / "events.jsonl") if e["type"] == "step"]
    first, last = steps[WARMUP_STEPS - 1], steps[-1]
    with np.load(jdir / "trainable.npz") as npz:
        weights = {k: npz[k] for k in npz.files}
    return {
        "losses": [float(e["data"]["loss"]) for e in steps],
        "weights": weights,
        "samples_per_s": (last["data"]["step"] - first["data"]["step"])
        * spec.train.batch_size
        / (last["ts"] - first["ts"]),
        "peak_rss_mb": float(result["peak_rss_mb"]),
    }


def compare(ort: dict[str, Any], ag: dict[str, Any]) -> dict[str, Any]:
    """The largest relative difference of the per-step losses and absolute one of the weights."""
    import numpy as np

    a, o = np.array(ag["losses"]), np.array(ort["losses"])
    if len(a) != len(o):
        return {"loss_rel_text": f"{len(o)} vs {len(a)} steps"}
    rel = float(np.max(np.abs(a - o) / np.maximum(np.abs(o), 1e-12)))
    if ort["weights"].keys() != ag["weights"].keys():
        return {"loss_rel": rel, "weight_abs_text": "other tensors"}
    worst = max(ort["weights"], key=lambda n: float(np.max(np.abs(ag["weights"][n] - ort["weights"][n]))))
    diff = float(np.max(np.abs(ag["weights"][worst] - ort["weights"][worst])))
    return {"loss_rel": rel, "weight_abs": diff, "worst_tensor": worst, "trainable_tensors": len(ort["weights"]),
            "first_loss": [o[0], a[0]], "last_loss": [o[-1], a[-1]],
            "loss_rel_text": f"{rel:.2e}", "weight_abs_text": f"{diff:.2e}"}  # fmt: skip


def bench_recipe(recipe_file: str, steps: int, pairs: int, python: Path, root: Path, blocked: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """One recipe's row: equivalence of the first pair, speed and memory over ``pairs`` pairs."""
    built, row = jobs(recipe_file, steps, root)
    if not built:
        return row
    (ort_spec, ort_files, _), (ag_spec, ag_files, _) = built["ort-training"], built["autograd"]
    runs = interleaved_pairs(
        lambda: run_job(python, root, ort_spec, ort_files, board_env()),
        lambda: run_job(python, root, ag_spec, ag_files, blocked),
        pairs,
    )
    row |= compare(*runs[0])
    ulp = run_job(
        python, root, *perturbed(ag_spec, ag_files, state_dir("cache", "bench", "runtimes")), blocked
    )
    chaos = compare(runs[0][1], ulp)  # the autograd job against itself from weights 1 ulp away
    row |= {f"ulp_{k}": chaos.get(k) for k in ("loss_rel", "weight_abs", "loss_rel_text", "weight_abs_text")}
    row["repeatable"] = all(o["losses"] == runs[0][0]["losses"] and a["losses"] == runs[0][1]["losses"]
                            for o, a in runs)  # fmt: skip
    for i, name in enumerate(("ort", "autograd")):
        sps = spread([r[i]["samples_per_s"] for r in runs], 1)
        rss = spread([r[i]["peak_rss_mb"] for r in runs], 1)
        row |= {f"{name}_samples_per_s": sps, f"{name}_peak_rss_mb": rss,
                f"{name}_sps_text": median_range(sps), f"{name}_rss_text": median_range(rss)}  # fmt: skip
    ratio = spread([a["samples_per_s"] / o["samples_per_s"] for o, a in runs])
    row |= {"autograd_over_ort_samples_per_s": ratio, "pairs": pairs}
    return row


def main() -> int:
    """Run the recipes, print the table, write bench/results/runtimes.json."""
    from tasks.vboard.venv import ensure_board_venv

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="digits only, 1 pair")
    parser.add_argument(
        "--pairs", type=int, default=PAIRS, help="interleaved (ORT, autograd) pairs per recipe"
    )
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps of each job")
    parser.add_argument(
        "--recipes", nargs="*", default=None, help="recipe files (default: the six references)"
    )
    parser.add_argument("--out", type=Path, help="result file (default bench/results/runtimes.json)")
    args = parser.parse_args()
    os.environ.setdefault("ODL_HOME", str(state_dir("cache", "bench", "runtimes-home")))
    python = ensure_board_venv(BOARD_VENV)
    plan = RECIPES[:1] if args.quick else (args.recipes or RECIPES)
    pairs = 1 if args.quick else args.pairs
    root = state_dir("cache", "bench", "runtimes-root")
    blocker = state_dir("cache", "bench", "runtimes-blocker")
    from tests.runtimes.conftest import BLOCKER  # the tests' sitecustomize refusing onnxruntime.training

    (blocker / "sitecustomize.py").write_text(BLOCKER)
    blocked = {**board_env(), "PYTHONPATH": os.pathsep.join([str(blocker), str(PROJECT_ROOT)])}
    rows = []
    for recipe_file in plan:
        rows.append(bench_recipe(recipe_file, args.steps, pairs, python, root, blocked))
        print(f"{recipe_file}: {rows[-1].get('why') or 'done'}", file=sys.stderr, flush=True)
    path = write_results("runtimes", {"rows": rows, "quick": args.quick, "pairs": pairs, "steps": args.steps,
                                      "warmup_steps": WARMUP_STEPS}, args.out)  # fmt: skip
    print(table([r for r in rows if "why" not in r], COLUMNS))
    for r in rows:
        if "why" in r:
            print(f"{r['recipe']}: not compared: {r['why']}")
    print(
        f"medians of {pairs} interleaved pair(s) (min-max, n); samples/s from step {WARMUP_STEPS} to {args.steps}"
    )
    print(f"figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
