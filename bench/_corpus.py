"""The command line of a task's corpus benchmark (bench/segmentation_corpus.py,
bench/keypoints_corpus.py): each case prepared in its own subprocess (``--child NAME --work DIR``
prints its row as JSON), ``--quick N --seed S`` a seeded sample, ``--models`` a list; the rows
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

CHILD_TIMEOUT_S = 1200
COLUMNS = [("model", "model"), ("size", "px"), ("params", "params"), ("trainable", "trainable"),
           ("seconds", "s"), ("board_peak_mb", "board MB"), ("kind", "result"), ("short", "message")]  # fmt: skip


def prepared_row(name: str, size: int, write: Callable[[], Path], out: Path) -> dict:
    """Prepare the recipe ``write()`` returns into ``out``; the case's row (pipeline errors are
    classified by :func:`tests.corpus.generator.outcome`, never raised)."""
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe
    from tests.corpus.generator import outcome

    start = time.perf_counter()
    row: dict = {"model": name, "size": size}
    try:
        done = prepare(load_recipe(write()), out)
    except Exception as exc:  # noqa: BLE001 - every failure is classified
        row["kind"], row["message"] = outcome(exc)
    else:
        val, manifest = done.validation or {}, done.manifest
        row.update(kind="pass", message="", trainable=manifest["trainable_count"], params=manifest.get("model_params"),
                   loss=manifest.get("loss"), fixups=manifest.get("fixups", {}),
                   board_peak_mb=round(val.get("board_peak_estimate_mb", 0.0)))  # fmt: skip
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def run_one(script: str, name: str) -> dict:
    """``script --child name`` in a subprocess with a throw-away work folder; a crash or a timeout
    is a raw row."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="odl-corpus-") as tmp:
        row, failure = child_json([sys.executable, script, "--child", name, "--work", tmp], CHILD_TIMEOUT_S)
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
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
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
        rows.append(run_one(script, name))
        r = rows[-1]
        print(f"{name:34s} {r['seconds']:7.1f}s  {r['kind']:8s} {r['message'][:140]}", flush=True)
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
