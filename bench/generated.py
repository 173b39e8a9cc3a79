"""Generated-architecture benchmark: N classifiers drawn by tests/corpus/generator.py (Hypothesis,
seeded) through ``prepare`` under one training runtime or both side by side (``--runtime``),
classified pass / specific / raw, with the failure classes found. ``--corpus sequences`` draws
tests/corpus/families.py's token, sequence and audio models instead (results in
``generated_sequences.json``).

Each example is the idioms of hand-written model code composed at random (conv/BN/activation
orders, fixed and adaptive pooling, residual adds, dense concats, depthwise and grouped convs,
squeeze-excitation, LayerNorm/GELU/attention over tokens, upsampling, a module used twice,
view/flatten/reshape heads, an embedded loss on int32 or int64 labels). A ``raw`` example's spec is
printed whole, to be shrunk and kept under tests/corpus/regressions/.

    .venv/bin/python bench/generated.py --examples 500 --seed 1     # ~15 min on 2 cores
    .venv/bin/python bench/generated.py --runtime both               # each example under both runtimes
    .venv/bin/python bench/generated.py --corpus sequences           # token, sequence and audio idioms
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from bench._common import write_results  # noqa: E402
from bench._sides import add_runtime_argument, runtimes_of, summary  # noqa: E402
from tests.corpus.families import sequence_architectures  # noqa: E402
from tests.corpus.generator import architectures, prepare_spec  # noqa: E402

CORPORA = {"images": architectures, "sequences": sequence_architectures}


def specs(examples: int, seed_value: int, corpus: str = "images") -> list[dict]:
    """The first ``examples`` specs :func:`run` draws from ``corpus`` with ``seed_value``, in order."""
    drawn: list[dict] = []

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(CORPORA[corpus]())
    def one(spec: dict) -> None:
        drawn.append(spec)

    one()
    return drawn


def run(
    examples: int,
    seed_value: int,
    runtimes: tuple[str, ...] = ("ort-training",),
    progress: Callable[[list[dict]], object] = lambda rows: None,
    corpus: str = "images",
) -> list[dict]:
    """Prepare ``examples`` generated specs under each runtime; one row per (example, runtime):
    name, runtime, result, message, seconds, spec. ``progress`` gets the rows after each example."""
    rows: list[dict] = []

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(CORPORA[corpus]())
    def one(spec: dict) -> None:
        name = f"#{len(rows) // len(runtimes) + 1}"
        for runtime in runtimes:
            with tempfile.TemporaryDirectory(prefix="odl-gen-") as tmp:
                start = time.perf_counter()
                kind, message = prepare_spec(spec, Path(tmp), runtime)
            row = {"name": name, "runtime": runtime, "result": kind, "message": message,
                   "seconds": round(time.perf_counter() - start, 2), "spec": spec}  # fmt: skip
            rows.append(row)
            print(f"{name:>5s} {runtime:12s} {kind:8s} {row['seconds']:5.1f}s {message[:140]}", flush=True)
        progress(rows)

    one()
    return rows


def failure_class(message: str) -> str:
    """The message without its file names, numbers and quoted names: one key per failure class."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\S+\.(py|onnx|npz)\S*|\d+", "_", message)
    return text[:120]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", choices=sorted(CORPORA), default="images",
                    help="images: tests/corpus/generator.py's classifiers; sequences: tests/corpus/families.py's")  # fmt: skip
    add_runtime_argument(ap)
    ap.add_argument("--out", type=Path, help="result JSON (default bench/results/generated.json)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    runtimes, name = (
        runtimes_of(args.runtime),
        "generated" if args.corpus == "images" else "generated_sequences",
    )
    start = time.perf_counter()
    rows = run(
        args.examples,
        args.seed,
        runtimes,
        lambda rows: write_results(name, _figures(rows, runtimes, args.seed, start), args.out),
        args.corpus,
    )
    figures = _figures(rows, runtimes, args.seed, start)
    path = write_results(name, figures, args.out)
    print(
        f"\n{figures['examples']} examples, seed {args.seed}, {figures['wall_s']} s\n{summary(rows, runtimes)[1]}"
    )
    for c in figures["classes"]:
        print(f"{c['count']:4d} {c['runtime']:12s} {c['kind']:8s} {c['class']}")
    for spec in figures["raw_specs"]:
        print("raw spec:", json.dumps(spec))
    print(f"figures: {path}")
    return 0


def _figures(rows: list[dict], runtimes: tuple[str, ...], seed_value: int, start: float) -> dict:
    """The result file's figures: counts over every row, per runtime, failure classes, raw specs."""
    sides, _ = summary(rows, runtimes)
    counts = Counter(r["result"] for r in rows)
    classes = Counter(
        (r["runtime"], r["result"], failure_class(r["message"])) for r in rows if r["result"] != "pass"
    )
    return {"examples": len(rows) // len(runtimes), "seed": seed_value, **{k: counts.get(k, 0) for k in ("pass", "specific", "raw")},
            **sides, "wall_s": round(time.perf_counter() - start),
            "classes": [{"runtime": rt, "kind": k, "class": c, "count": n} for (rt, k, c), n in classes.most_common()],
            "raw_specs": [r["spec"] for r in rows if r["result"] == "raw"], "rows": rows}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
