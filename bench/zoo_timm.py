"""timm benchmark: the smallest variant of every timm architecture family through ``odl prepare``.

A family is a timm model module (``timm.list_modules()``: resnet, efficientnet, levit, fastvit,
...); its smallest model (parameter count on the meta device, 10-class head) up to 30 M parameters
stands for it. Each runs in its own subprocess: random init (no download) with BatchNorm statistics
calibrated on its training images (bench/zoo.py's ``calibrate`` reasoning), the smallest input
size in 32-256 px its forward accepts (``img_size`` passed to models that take one), strategy
``last-conv+classifier``, then export -> generate_artifacts -> offline validation with the join and
judging rehearsals. Rows are ``pass``, ``specific`` (a one-line PipelineError naming the cause) or
``raw`` (ORT's or Python's own text, an empty reason, a crash, a timeout).

    .venv/bin/python bench/zoo_timm.py                 # every family (~1 h on 2 cores)
    .venv/bin/python bench/zoo_timm.py --quick 4 --seed 0   # a seeded sample (CI)
    .venv/bin/python bench/zoo_timm.py --models levit_128s,fastvit_t8
    .venv/bin/python bench/zoo_timm.py --runtime both   # each model under both training runtimes
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import table, write_results  # noqa: E402
from bench._sides import add_runtime_argument, runtimes_of, summary  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402
from tests.corpus.generator import UNSPECIFIC  # noqa: E402

MAX_PARAMS = 30e6
SIZES = (32, 64, 96, 128, 160, 192, 224, 256)
SAMPLES = 16
CHILD_TIMEOUT_S = 420
MODULE = """import timm

def net(num_classes=10, **kwargs):
    return timm.create_model({name!r}, pretrained=False, num_classes=num_classes, **kwargs)
"""


FAMILIES = Path(__file__).with_name("timm_families.json")  # the lists, made once (--refresh remakes them)
SPLIT_FAMILIES = Path(__file__).with_name("timm_families_split.json")


def families(refresh: bool = False, split: bool = False) -> list[tuple[str, str, int]]:
    """(model, family, parameters) of the smallest model of each timm module (or of each
    architecture stem within a module, ``split``) up to MAX_PARAMS, from bench/timm_families*.json
    unless ``refresh`` (building every timm model on the meta device takes ~10 min)."""
    path = SPLIT_FAMILIES if split else FAMILIES
    if path.is_file() and not refresh:
        return [tuple(row) for row in json.loads(path.read_text())]
    rows = _families(split)
    path.write_text(json.dumps(rows, indent=0) + "\n")
    return rows


SIZE_WORDS = {"atto", "femto", "pico", "nano", "micro", "mini", "tiny", "small", "medium", "base", "large",
              "huge", "giant", "gigantic", "xxs", "xs", "s", "m", "l", "xl", "xxl", "t", "b"}  # fmt: skip


def stem(name: str, module: str) -> str:
    """A model's architecture within its timm module: its name without sizes and numbers
    (``seresnext26d_32x4d`` -> ``resnet:seresnext``, ``efficientnet_b0`` -> ``efficientnet:efficientnet``)."""
    tokens = name.split(".")[0].split("_")
    head = re.match(r"[a-z]+", tokens[0])
    kept = [head.group(0) if head else tokens[0]]
    kept += [t for t in tokens[1:] if t not in SIZE_WORDS and not re.search(r"\d", t)]
    return f"{module}:{'_'.join(kept)}"


def _families(split: bool = False) -> list[tuple[str, str, int]]:
    """The smallest model per module, or per architecture stem within each module (``split``)."""
    import timm
    import torch

    rows = []
    for module in timm.list_modules():
        best = None
        for name in timm.list_models(module=module):
            try:
                with torch.device("meta"):
                    n = sum(
                        p.numel()
                        for p in timm.create_model(name, pretrained=False, num_classes=10).parameters()
                    )
            except Exception:  # noqa: BLE001 - a model that cannot be built on meta is skipped
                continue
            if n <= MAX_PARAMS and (best is None or n < best[2]):
                best = (name, module, n)
        if best:
            rows.append(best)
    return rows


def _size(name: str) -> tuple[int, dict]:
    """The smallest input size whose forward works, and the kwargs that made it work."""
    import timm
    import torch

    for size in SIZES:
        for kwargs in ({}, {"img_size": size}):
            try:
                model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs).eval()
                with torch.no_grad():
                    model(torch.randn(2, 3, size, size))
                return size, kwargs
            except Exception:  # noqa: BLE001 - the next size or kwargs
                continue
    raise RuntimeError(f"no input size in {SIZES} accepted")


def child(name: str, work: Path, runtime: str = "ort-training") -> dict:
    """Prepare one timm model in ``work`` under the training ``runtime`` at the smallest size its
    forward and the exporter take; the row of the table."""
    size, kwargs = _size(name)
    for bigger in [s for s in SIZES if s > size]:  # the smallest input the exporter takes too
        row = _prepare_at(name, size, kwargs, work, runtime)
        if row["result"] == "pass" or "cannot export" not in row.get("message", ""):
            return row
        size, kwargs = bigger, ({"img_size": bigger} if kwargs else {})
    return _prepare_at(name, size, kwargs, work, runtime)


def write_case(name: str, size: int, kwargs: dict, work: Path, runtime: str = "ort-training") -> Path:
    """``name``'s recipe folder in ``work`` at input ``size`` (random data, calibrated BatchNorm
    weights, the model module, recipe.toml under the training ``runtime``); returns the recipe."""
    import numpy as np
    import timm
    import torch

    from bench.zoo import calibrate_module

    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    (work / "data").mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        x = rng.standard_normal((SAMPLES, 3, size, size), dtype=np.float32)
        np.savez(work / "data" / f"{split}.npz", x=x, y=rng.integers(0, 10, SAMPLES))
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
    calibrate_module(model, work / "data" / "train.npz", work / "weights.pt")
    (work / "timm_model.py").write_text(MODULE.format(name=name))
    kw = "".join(f"{k} = {v}\n" for k, v in kwargs.items())
    (work / "recipe.toml").write_text(
        f'name = "timm"\ntask = "classification"\n[model]\ncallable = "timm_model:net"\nnum_classes = 10\n'
        f'input_shape = [3, {size}, {size}]\nweights = "weights.pt"\n'
        + (f"[model.kwargs]\n{kw}" if kw else "")
        + '[trainable]\nstrategy = "last-conv+classifier"\n[loss]\nkind = "cross-entropy"\n'
        "[training]\nbatch_size = 4\nepochs = 1\n"
        f'runtime = "{runtime}"\n[data]\ntrain = "data/train.npz"\ntest = "data/test.npz"\n'
    )
    return work / "recipe.toml"


def _prepare_at(name: str, size: int, kwargs: dict, work: Path, runtime: str) -> dict:
    """Prepare ``name`` at input ``size`` in a fresh ``work`` subfolder; the row of the table."""
    from tasks.errors import PipelineError
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe
    from tests.corpus.generator import outcome

    work = work / f"{size}px"
    recipe = write_case(name, size, kwargs, work, runtime)
    row: dict = {"model": name, "size": size}
    start = time.perf_counter()
    try:
        done = prepare(load_recipe(recipe), work / "prepared")
    except PipelineError as exc:
        kind, message = outcome(exc)
        row.update(result=kind, message=message)
    else:
        row.update(result="pass", trainable=done.manifest["trainable_count"],
                   layers=[r["layer"] for r in done.manifest.get("trainable_layers", [])][:3])  # fmt: skip
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def run_one(
    name: str, family: str, params: int, runtime: str = "ort-training", timeout: float = CHILD_TIMEOUT_S
) -> dict:
    """``child`` in a subprocess; a crash or a ``timeout`` is a raw row."""
    with tempfile.TemporaryDirectory(prefix="odl-timm-") as tmp:
        cmd = [sys.executable, __file__, "--child", name, "--work", tmp, "--runtime", runtime]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=timeout)
            lines = proc.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
            if row is None:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                row = {"model": name, "result": "raw", "message": f"crash (exit {proc.returncode}): {tail}"}
        except subprocess.TimeoutExpired:
            row = {"model": name, "result": "raw", "message": f"timeout: no result in {timeout:g} s"}
        row.setdefault("seconds", round(time.perf_counter() - start, 1))
    row.update(family=family, params=params, name=name, runtime=runtime)
    if row["result"] == "specific" and UNSPECIFIC.search(row.get("message", "")):
        row["result"] = "raw"
    return row


def _figures(rows: list[dict], runtimes: tuple[str, ...], seconds: float) -> dict:
    """The result file's figures: counts over every (model, runtime) row, then per runtime."""
    counts = {k: sum(r["result"] == k for r in rows) for k in ("pass", "specific", "raw")}
    n = max(1, len(rows))
    return {"families": len(rows) // len(runtimes), **counts, "pass_ratio": counts["pass"] / n,
            "pass_or_specific_ratio": (counts["pass"] + counts["specific"]) / n, **summary(rows, runtimes)[0],
            "wall_s": round(seconds), "rows": rows}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", type=int, help="a seeded sample of this many families")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", help="comma-separated timm names")
    ap.add_argument("--refresh", action="store_true", help="list timm's families again (~10 min)")
    ap.add_argument(
        "--split-families", action="store_true", help="one model per architecture stem, not per module"
    )
    ap.add_argument("--skip", type=Path, help="a results JSON whose models are not run again")
    ap.add_argument("--out", type=Path, help="result JSON (default bench/results/zoo_timm.json)")
    add_runtime_argument(ap, child=True)
    ap.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S, help="seconds per model and runtime")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.work, args.runtime)))
        return 0
    rows_in = (
        families(args.refresh, args.split_families)
        if not args.models
        else [(m, "-", 0) for m in args.models.split(",")]
    )
    if args.skip:
        done = {r["model"] for r in json.loads(args.skip.read_text())["rows"]}
        rows_in = [r for r in rows_in if r[0] not in done]
    if args.quick:
        rows_in = random.Random(args.seed).sample(rows_in, min(args.quick, len(rows_in)))
    rows, runtimes, start = [], runtimes_of(args.runtime), time.perf_counter()
    for name, family, params in rows_in:
        for runtime in runtimes:
            rows.append(run_one(name, family, params, runtime, args.timeout))
            r = rows[-1]
            print(f"{name:32s} {runtime:12s} {r.get('size', 0):4d}px {r['seconds']:7.1f}s {r['result']:8s} "
                  f"{r.get('message', '')}", flush=True)  # fmt: skip
        write_results(
            "zoo_timm", _figures(rows, runtimes, time.perf_counter() - start), args.out
        )  # kept so far
    figures = _figures(rows, runtimes, time.perf_counter() - start)
    path = write_results("zoo_timm", figures, args.out)
    for r in rows:
        r["params_m"] = round(r["params"] / 1e6, 2)
        r["short"] = (r.get("message") or r["result"])[:110]
    print(table(rows, [("family", "family"), ("model", "model"), ("runtime", "runtime"), ("params_m", "params (M)"), ("size", "px"),
                       ("trainable", "trainable"), ("seconds", "s"), ("short", "result")]))  # fmt: skip
    n = len(rows)
    print(f"coverage: {figures['pass']}/{n} pass ({figures['pass_ratio']:.0%}), "
          f"{figures['pass'] + figures['specific']}/{n} pass or specific ({figures['pass_or_specific_ratio']:.0%})")  # fmt: skip
    print(
        f"{figures['families']} models, {figures['wall_s']} s\n{summary(rows, runtimes)[1]}\nfigures: {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
