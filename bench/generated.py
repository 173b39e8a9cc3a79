"""Generated-architecture benchmark: N classifiers drawn by tests/corpus/generator.py (Hypothesis,
seeded) through ``prepare``, classified pass / specific / raw, with the failure classes found.

Each example is the idioms of hand-written model code composed at random (conv/BN/activation
orders, fixed and adaptive pooling, residual adds, dense concats, depthwise and grouped convs,
squeeze-excitation, LayerNorm/GELU/attention over tokens, upsampling, a module used twice,
view/flatten/reshape heads, an embedded loss on int32 or int64 labels). A ``raw`` example's spec is
printed whole, to be shrunk and kept under tests/corpus/regressions/.

    .venv/bin/python bench/generated.py --examples 500 --seed 1     # ~15 min on 2 cores
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from bench._common import write_results  # noqa: E402
from tests.corpus.generator import architectures, prepare_spec  # noqa: E402


def run(examples: int, seed_value: int) -> list[dict]:
    """Prepare ``examples`` generated specs; one row each (kind, message, seconds, spec)."""
    rows: list[dict] = []

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(architectures())
    def one(spec: dict) -> None:
        with tempfile.TemporaryDirectory(prefix="odl-gen-") as tmp:
            start = time.perf_counter()
            kind, message = prepare_spec(spec, Path(tmp))
        rows.append(
            {"kind": kind, "message": message, "seconds": round(time.perf_counter() - start, 2), "spec": spec}
        )
        print(f"{len(rows):4d} {kind:8s} {rows[-1]['seconds']:5.1f}s {message[:150]}", flush=True)

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
    ap.add_argument("--out", type=Path, help="result JSON (default bench/results/generated.json)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rows = run(args.examples, args.seed)
    counts = Counter(r["kind"] for r in rows)
    classes = Counter((r["kind"], failure_class(r["message"])) for r in rows if r["kind"] != "pass")
    figures = {"examples": len(rows), "seed": args.seed, **{k: counts.get(k, 0) for k in ("pass", "specific", "raw")},
               "classes": [{"kind": k, "class": c, "count": n} for (k, c), n in classes.most_common()],
               "raw_specs": [r["spec"] for r in rows if r["kind"] == "raw"], "rows": rows}  # fmt: skip
    path = write_results("generated", figures, args.out)
    n = max(1, len(rows))
    print(f"\n{len(rows)} examples: {counts.get('pass', 0)} pass ({counts.get('pass', 0) / n:.0%}), "
          f"{counts.get('specific', 0)} specific, {counts.get('raw', 0)} raw; "
          f"pass or specific {(counts.get('pass', 0) + counts.get('specific', 0)) / n:.0%}")  # fmt: skip
    for (kind, cls), count in classes.most_common():
        print(f"{count:4d} {kind:8s} {cls}")
    for spec in figures["raw_specs"]:
        print("raw spec:", json.dumps(spec))
    print(f"figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
