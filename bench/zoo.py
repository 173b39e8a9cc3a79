"""Zoo benchmark: every torchvision classifier up to 100 M parameters through ``odl prepare``.

Each model (random init with BatchNorm statistics calibrated on its training images, a new 10-class head,
strategy ``last-conv+classifier`` unless --strategy)
runs export -> generate_artifacts -> offline validation in its own subprocess, at the smallest input
size its architecture accepts (torchvision's weight metadata ``min_size``, at least 32 px; the next of
64-224 px when the exporter rejects an adaptive pooling at that size, as AlexNet's at 63 px). The
table gives model, parameters, trainable parameters, result (``pass`` or the error class and its
one-line message), seconds and the board peak estimate; the coverage line counts passes and rows
that stop with a specific message. A row fails the "specific" test when it holds C++ assertion
text, a Python traceback, or the child crashed without a report.

    .venv/bin/python bench/zoo.py                     # the full sweep (~30 min on 2 cores)
    .venv/bin/python bench/zoo.py --quick             # three small models (the CI smoke test)
    .venv/bin/python bench/zoo.py --models resnet18,googlenet
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import table, write_results  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

MAX_PARAMS = 100e6
MIN_SIZE = 32
RETRY_SIZES = (64, 96, 128, 160, 192, 224)
SAMPLES = 16
CHILD_TIMEOUT_S = 900
# the smoke test's: three that needed a fix-up, a strategy or export without deep copy (the hard
# activations' decomposition, a classifier ending in a Conv, MNASNet's export without a deep copy), ~10 s each
QUICK = ("mobilenet_v3_small", "squeezenet1_1", "mnasnet0_5")
# text a user must never read: C++ source positions, ORT's assertion phrasing, Python tracebacks
UNSPECIFIC = re.compile(r"\.(cc|cpp|h):\d+|was false\.|Traceback \(most recent call last\)|^\s+File \"", re.M)


def zoo() -> list[tuple[str, int, int]]:
    """(name, ImageNet parameter count, input size) of every classifier up to MAX_PARAMS."""
    from torchvision import models

    rows = []
    for name in models.list_models(module=models):
        meta = next(iter(models.get_model_weights(name))).meta
        if meta["num_params"] <= MAX_PARAMS:
            rows.append((name, meta["num_params"], max(MIN_SIZE, *meta.get("min_size", (1, 1)))))
    return rows


def child(name: str, size: int, strategy: str, work: Path) -> dict:
    """Prepare one model in ``work``; the row of the table (never raises for pipeline errors)."""
    import numpy as np

    from tasks.errors import ModelError, PipelineError
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    rng = np.random.default_rng(0)
    (work / "data").mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        x = rng.standard_normal((SAMPLES, 3, size, size), dtype=np.float32)
        np.savez(work / "data" / f"{split}.npz", x=x, y=rng.integers(0, 10, SAMPLES))
    calibrate(name, work / "data" / "train.npz", work / "weights.pt")
    recipe_path = work / "recipe.toml"
    recipe_path.write_text(
        f'name = "zoo-{name.replace("_", "-")}"\ntask = "classification"\n'
        f'[model]\ntorchvision = "{name}"\nnum_classes = 10\ninput_shape = [3, {size}, {size}]\n'
        'weights = "weights.pt"\n'
        f'[trainable]\nstrategy = "{strategy}"\n[loss]\nkind = "cross-entropy"\n'
        "[training]\nbatch_size = 4\nepochs = 1\n"
        '[data]\ntrain = "data/train.npz"\ntest = "data/test.npz"\n'
    )
    start = time.perf_counter()
    row: dict = {"model": name, "size": size}
    try:
        try:
            done = prepare(load_recipe(recipe_path), work / "prepared")
        except ModelError as exc:
            # the exporter rejects an adaptive pooling whose input is not a multiple of its output
            # (AlexNet's 6x6 at 63 px): the smallest size the exporter accepts is the next one
            bigger = [s for s in RETRY_SIZES if s > size]
            if "adaptive_avg_pool" not in str(exc) or not bigger:
                raise
            retried = child(name, bigger[0], strategy, work)
            retried["note"] = f"{size} px: {exc}"
            return retried
    except PipelineError as exc:
        row.update(result=f"{type(exc).__name__}: {exc}")
    else:
        val = done.validation or {}
        row.update(
            result="pass",
            trainable=done.manifest["trainable_count"],
            board_peak_mb=round(val.get("board_peak_estimate_mb", 0.0)),
        )
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def calibrate(name: str, data: Path, out: Path) -> None:
    """Random init whose BatchNorm running statistics are those of the training images (one batch),
    saved as the recipe's weights: frozen BatchNorm normalises with them, as it would with a
    pretrained model's fitting its data. A random init's mean 0 / variance 1 lets deep ResNets blow
    up; statistics averaged over small batches, or taken on other random images, leave a
    random-init EfficientNet-B7 answering 1e5 on these (its float32 rounding then exceeds the
    inference check's tolerance)."""
    import torch
    from torchvision import models

    torch.manual_seed(0)
    calibrate_module(models.get_model(name, weights=None, num_classes=10), data, out)


def calibrate_module(model, data: Path, out: Path) -> None:
    """Set ``model``'s BatchNorm running statistics to those of the images in ``data`` (one batch)
    and save its state_dict to ``out`` (see :func:`calibrate`)."""
    import numpy as np
    import torch

    model.eval()  # no auxiliary heads, no dropout: only the BatchNorms update their statistics
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.momentum = None  # cumulative moving average: one batch gives its statistics
            m.train()
    with torch.no_grad():
        model(torch.from_numpy(np.load(data)["x"]))
    torch.save(model.state_dict(), out)


def run_one(name: str, params: int, size: int, strategy: str) -> dict:
    """Run ``child`` in a subprocess; a crash or timeout becomes an unspecific row."""
    with tempfile.TemporaryDirectory(prefix="odl-zoo-") as tmp:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            name,
            "--size",
            str(size),
            "--strategy",
            strategy,
            "--work",
            tmp,
        ]
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=CHILD_TIMEOUT_S
            )
            lines = proc.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
            if row is None:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                row = {"model": name, "size": size, "result": f"crash (exit {proc.returncode}): {tail}"}
        except subprocess.TimeoutExpired:
            row = {"model": name, "size": size, "result": f"crash: no result in {CHILD_TIMEOUT_S} s"}
        row.setdefault("seconds", round(time.perf_counter() - start, 1))
    row["params"] = params
    row["specific"] = row["result"] == "pass" or not (
        row["result"].startswith("crash") or UNSPECIFIC.search(row["result"]) or "\n" in row["result"].strip()
    )
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--models", help="comma-separated torchvision names (default: the whole zoo)")
    ap.add_argument("--strategy", default="last-conv+classifier")
    ap.add_argument("--out", type=Path, help="result JSON (default bench/results/zoo.json)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.size, args.strategy, args.work)))
        return 0
    wanted = set(QUICK) if args.quick else set(args.models.split(",")) if args.models else None
    models = [m for m in zoo() if wanted is None or m[0] in wanted]
    rows = []
    for name, params, size in models:
        rows.append(run_one(name, params, size, args.strategy))
        r = rows[-1]
        print(f"{name:22s} {r['size']:4d}px {r['seconds']:7.1f}s  {r['result'][:150]}", flush=True)
    passed = sum(r["result"] == "pass" for r in rows)
    specific = sum(r["specific"] for r in rows)
    figures = {
        "strategy": args.strategy,
        "models": len(rows),
        "passed": passed,
        "pass_ratio": passed / max(1, len(rows)),
        "pass_or_specific_ratio": specific / max(1, len(rows)),
        "rows": rows,
    }
    path = write_results("zoo", figures, args.out)
    for r in rows:
        r["params_m"] = round(r["params"] / 1e6, 1)
        r["trainable_k"] = round(r.get("trainable", 0) / 1e3, 1) if "trainable" in r else ""
        r["short"] = r["result"] if len(r["result"]) < 100 else r["result"][:97] + "..."
    print(table(rows, [("model", "model"), ("params_m", "params (M)"), ("size", "px"), ("trainable_k", "trainable (k)"),
                       ("seconds", "s"), ("board_peak_mb", "board MB"), ("short", "result")]))  # fmt: skip
    print(f"coverage: {passed}/{len(rows)} pass ({figures['pass_ratio']:.0%}), "
          f"{specific}/{len(rows)} pass or stop with a specific message ({figures['pass_or_specific_ratio']:.0%})")  # fmt: skip
    print(f"figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
