"""The command line of a task's corpus benchmark (bench/segmentation_corpus.py,
bench/keypoints_corpus.py, bench/sequence_corpus.py, bench/token_corpus.py): each case prepared in its own subprocess (``--child NAME --work DIR``
prints its row as JSON), ``--quick N --seed S`` a seeded sample, ``--models`` a list, ``--runtime``
the training runtime every case is prepared under (default: the recipes' own, autograd); the rows
classified pass / specific / raw, written to ``bench/results/<name>.json`` and printed as a table.

Benchmarks are scripts; each puts the project root on ``sys.path`` before importing this module.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench._common import child_json, table, write_results
from tasks.paths import PROJECT_ROOT

CHILD_TIMEOUT_S = 1200
COLUMNS = [("model", "model"), ("size", "px"), ("params", "params"), ("trainable", "trainable"),
           ("seconds", "s"), ("board_peak_mb", "board MB"), ("kind", "result"), ("short", "message")]  # fmt: skip
# what --runtime sets in a child, beneath a case's own overrides
OVERRIDES: dict = {}


def prepared_row(
    name: str, size: int, write: Callable[[], Path], out: Path, overrides: dict | None = None
) -> dict:
    """Prepare the recipe ``write()`` returns (with ``overrides``, as ``odl prepare --set``) into
    ``out``; the case's row (pipeline errors are classified by
    :func:`tests.corpus.generator.outcome`, never raised). ``seconds`` counts the case's writing
    too; ``prepare_seconds`` only ``prepare`` (validation included)."""
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe
    from tests.corpus.generator import outcome

    start = time.perf_counter()
    row: dict = {"model": name, "size": size}
    try:
        recipe = load_recipe(write(), {**OVERRIDES, **(overrides or {})})
        prepare_start = time.perf_counter()
        done = prepare(recipe, out)
    except Exception as exc:  # noqa: BLE001 - every failure is classified
        row["kind"], row["message"] = outcome(exc)
    else:
        val, manifest = done.validation or {}, done.manifest
        row.update(kind="pass", message="", trainable=manifest["trainable_count"], params=manifest.get("model_params"),
                   loss=manifest.get("loss"), fixups=manifest.get("fixups", {}),
                   board_peak_mb=round(val.get("board_peak_estimate_mb", 0.0)))  # fmt: skip
    end = time.perf_counter()
    row["seconds"] = round(end - start, 1)
    if "prepare_start" in locals():
        row["prepare_seconds"] = round(end - prepare_start, 1)
    return row


SEQUENCE_MODULE = '''"""The corpus' model builder (written by bench/_corpus.py)."""
import sys
sys.path.insert(0, {root!r})
from bench.{zoo} import build  # noqa: E402,F401
'''
# zoo -> (recipes/sequences.py's sample maker, the recipe's [model] lines of its input, its length)
SEQUENCE_INPUTS = {"sequence_zoo": ("windows", "input_shape = [3, 64]", 64),
                   "token_zoo": ("utterances", 'input_shape = [16]\ninput_dtype = "int64"', 16)}  # fmt: skip


def write_sequence_case(zoo: str, name: str, kind: str, args: dict, work: Path) -> Path:
    """A sequence or token case's recipe folder in ``work``: the board domain's samples of the
    reference recipe's maker (64 to train, 32 to test), the model module, recipe.toml (4 classes,
    the default strategy; BatchNorm re-measured on the training set when the model has one)."""
    import importlib

    import numpy as np
    import torch

    sys.path.insert(0, str(PROJECT_ROOT / "recipes"))
    import sequences

    maker, inputs, _ = SEQUENCE_INPUTS[zoo]
    (work / "data").mkdir(parents=True, exist_ok=True)
    for split, seed, n in (("train", 0, 64), ("test", 1, 32)):
        x, y = getattr(sequences, maker)(np.random.default_rng(seed), n, "board")
        np.savez(work / "data" / f"{split}.npz", x=x, y=y)
    (work / "corpus_model.py").write_text(SEQUENCE_MODULE.format(root=str(PROJECT_ROOT), zoo=zoo))
    model = importlib.import_module(f"bench.{zoo}").build(kind, **args)
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    kwargs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in {"kind": kind, **args}.items())
    recipe = work / "recipe.toml"
    recipe.write_text(
        f'name = "{zoo.split("_")[0]}-{name}"\ntask = "classification"\n'
        f'[model]\ncallable = "corpus_model:build"\nkwargs = {{{kwargs}}}\nnum_classes = 4\n{inputs}\n'
        f'[trainable]\nstrategy = "last-conv+classifier"\nbatchnorm_calibration = {64 if has_bn else 0}\n'
        '[loss]\nkind = "cross-entropy"\n[training]\nbatch_size = 8\nepochs = 1\n'
        '[data]\ntrain = "data/train.npz"\ntest = "data/test.npz"\n'
    )
    return recipe


def sequence_corpus_main(doc: str, zoo: str, corpus: dict[str, tuple[str, dict]], script: str) -> int:
    """The ``main`` of the sequence and token corpora: each case (name -> (``bench/<zoo>.py``'s
    kind, its arguments)) written by :func:`write_sequence_case` and prepared in its own child."""

    def child(name: str, work: Path) -> dict:
        kind, args = corpus[name]
        write = lambda: write_sequence_case(zoo, name, kind, args, work)  # noqa: E731
        return prepared_row(name, SEQUENCE_INPUTS[zoo][2], write, work / "prepared")

    return corpus_main(doc, zoo.replace("_zoo", "_corpus"), list(corpus), script, child)


def run_one(script: str, name: str, runtime: str | None = None) -> dict:
    """``script --child name`` in a subprocess with a throw-away work folder (under ``runtime``
    when given); a crash or a timeout is a raw row."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="odl-corpus-") as tmp:
        argv = [
            sys.executable,
            script,
            "--child",
            name,
            "--work",
            tmp,
            *(["--runtime", runtime] if runtime else []),
        ]
        row, failure = child_json(argv, CHILD_TIMEOUT_S)
    row = row or {"model": name, "kind": "raw", "message": failure}
    row.setdefault("seconds", round(time.perf_counter() - start, 1))
    return row


def corpus_main(doc: str, result: str, cases: list[str], script: str,
                child: Callable[[str, Path], dict]) -> int:  # fmt: skip
    """The benchmark's ``main``: parse the arguments, run the chosen cases, write and print the figures."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", type=int, help="a seeded sample of this many cases")
    ap.add_argument("--seed", type=int, default=0, help="--quick's sample")
    ap.add_argument("--models", help=f"comma-separated cases (default: all {len(cases)})")
    ap.add_argument("--out", type=Path, help=f"result JSON (default bench/results/{result}.json)")
    ap.add_argument("--runtime", choices=["autograd", "ort-training"], help="prepare every case under this "
                    "training runtime (default: the recipes' own)")  # fmt: skip
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        OVERRIDES.update({"training.runtime": args.runtime} if args.runtime else {})
        print(json.dumps(child(args.child, args.work)))
        return 0
    names = args.models.split(",") if args.models else list(cases)
    unknown = sorted(set(names) - set(cases))
    if unknown:
        ap.error(f"--models: unknown cases {unknown} (known: {', '.join(cases)})")
    if args.quick:
        names = sorted(random.Random(args.seed).sample(names, min(args.quick, len(names))))
    rows = []
    for name in names:
        rows.append(run_one(script, name, args.runtime))
        r = rows[-1]
        print(f"{name:34s} {r['seconds']:7.1f}s  {r['kind']:8s} {r['message']}", flush=True)
    counts = {k: sum(r["kind"] == k for r in rows) for k in ("pass", "specific", "raw")}
    path = write_results(result, {"models": len(rows), **counts, "rows": rows}, args.out)
    for r in rows:
        r["short"] = r["message"] if len(r["message"]) < 100 else r["message"][:97] + "..."
    print(table(rows, COLUMNS))
    n = max(1, len(rows))
    print(f"{len(rows)} models: {counts['pass']} pass ({counts['pass'] / n:.0%}), {counts['specific']} specific, "
          f"{counts['raw']} raw; pass or specific {(counts['pass'] + counts['specific']) / n:.0%}")  # fmt: skip
    print(f"figures: {path}")
    return 0
