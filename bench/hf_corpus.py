"""Transformers corpus benchmark: Hugging Face ``transformers`` classifiers built from configs
(bench/hf_zoo.py: BERT, DistilBERT, ALBERT, RoBERTa, ELECTRA on int64 token ids; ViT, DeiT,
MobileViT, ConvNeXt, Swin, ResNet on 32 px images; tiny, random init, nothing from the hub) through
``prepare`` with validation, the default strategy ``last-conv+classifier`` (BatchNorm re-measured on
the training set where the model has one), under one training runtime or both side by side;
classified pass / specific (one line of the host error tree) / raw.

Text models read ``recipes/sequences.py:utterances`` (16 ids, 4 intents, the token recipe's board
domain); image models 4 classes told by the sign of two channels' means. Needs the ``bench`` extra
(``pip install -e .[bench]``: transformers).

    .venv/bin/python bench/hf_corpus.py --runtime both          # every model under both runtimes
    .venv/bin/python bench/hf_corpus.py --models bert,vit --runtime autograd
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import child_json, table, write_results  # noqa: E402
from bench._corpus import prepared_row  # noqa: E402
from bench._sides import add_runtime_argument, runtimes_of, summary  # noqa: E402
from bench.hf_zoo import IMAGE_SIZE, NAMES, TEXT_LENGTH, TEXT_MODELS, build  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

CHILD_TIMEOUT_S = 900
MODULE = '''"""The corpus' model builder (written by bench/hf_corpus.py)."""
import sys
sys.path.insert(0, {root!r})
from bench.hf_zoo import build  # noqa: E402,F401
'''


def write_case(name: str, runtime: str, work: Path) -> Path:
    """``name``'s recipe folder in ``work``: 64 training and 32 test samples, the model module,
    recipe.toml (4 classes, the default strategy, ``training.runtime = runtime``)."""
    import numpy as np
    import torch

    sys.path.insert(0, str(PROJECT_ROOT / "recipes"))
    import sequences  # the token recipe's sample maker (recipes/ is not a package)

    (work / "data").mkdir(parents=True, exist_ok=True)
    for split, seed, n in (("train", 0, 64), ("test", 1, 32)):
        rng = np.random.default_rng(seed)
        if name in TEXT_MODELS:
            x, y = sequences.utterances(rng, n, "board")
        else:
            x = rng.standard_normal((n, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
            y = (x[:, 0].mean((1, 2)) > 0).astype(np.int64) * 2 + (x[:, 1].mean((1, 2)) > 0)
        np.savez(work / "data" / f"{split}.npz", x=x, y=y)
    (work / "hf_model.py").write_text(MODULE.format(root=str(PROJECT_ROOT)))
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in build(name).modules())
    inputs = (
        f'input_shape = [{TEXT_LENGTH}]\ninput_dtype = "int64"'
        if name in TEXT_MODELS
        else f"input_shape = [3, {IMAGE_SIZE}, {IMAGE_SIZE}]"
    )
    recipe = work / "recipe.toml"
    recipe.write_text(
        f'name = "hf-{name}"\ntask = "classification"\n'
        f'[model]\ncallable = "hf_model:build"\nkwargs = {{kind = "{name}"}}\nnum_classes = 4\n{inputs}\n'
        f'[trainable]\nstrategy = "last-conv+classifier"\nbatchnorm_calibration = {64 if has_bn else 0}\n'
        f'[loss]\nkind = "cross-entropy"\n[training]\nbatch_size = 8\nepochs = 1\nruntime = "{runtime}"\n'
        '[data]\ntrain = "data/train.npz"\ntest = "data/test.npz"\n'
    )
    return recipe


def child(name: str, runtime: str, work: Path) -> dict:
    """Prepare ``name`` under ``runtime`` in ``work``; its row."""
    size = TEXT_LENGTH if name in TEXT_MODELS else IMAGE_SIZE
    return prepared_row(name, size, lambda: write_case(name, runtime, work), work / "prepared")


def run_one(name: str, runtime: str) -> dict:
    """:func:`child` in a subprocess; a crash or a timeout is a raw row."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="odl-hf-") as tmp:
        argv = [sys.executable, __file__, "--child", name, "--work", tmp, "--runtime", runtime]
        row, failure = child_json(argv, CHILD_TIMEOUT_S)
    row = row or {"model": name, "kind": "raw", "message": failure}
    row.setdefault("seconds", round(time.perf_counter() - start, 1))
    return {**row, "name": name, "runtime": runtime, "result": row["kind"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", help=f"comma-separated (default: all of {', '.join(NAMES)})")
    add_runtime_argument(ap)
    ap.add_argument("--out", type=Path, help="result JSON (default bench/results/hf_corpus.json)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.runtime, args.work)))
        return 0
    names = args.models.split(",") if args.models else list(NAMES)
    if set(names) - set(NAMES):
        ap.error(f"--models: unknown {sorted(set(names) - set(NAMES))} (known: {', '.join(NAMES)})")
    rows, runtimes, start = [], runtimes_of(args.runtime), time.perf_counter()
    for name in names:
        for runtime in runtimes:
            rows.append(run_one(name, runtime))
            r = rows[-1]
            print(
                f"{name:12s} {runtime:12s} {r['seconds']:7.1f}s  {r['kind']:8s} {r['message']}",
                flush=True,
            )
    sides, text = summary(rows, runtimes)
    path = write_results("hf_corpus", {"models": len(names), **sides, "wall_s": round(time.perf_counter() - start),
                                       "rows": rows}, args.out)  # fmt: skip
    for r in rows:
        r["short"] = r["message"] if len(r["message"]) < 100 else r["message"][:97] + "..."
    print(table(rows, [("model", "model"), ("runtime", "runtime"), ("params", "params"), ("trainable", "trainable"),
                       ("seconds", "s"), ("kind", "result"), ("short", "message")]))  # fmt: skip
    print(f"{len(names)} models, {round(time.perf_counter() - start)} s\n{text}\nfigures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
