"""Teacher labelling on the board beside training: samples/s of the teacher, the job's peak RSS with
and without a teacher, and how long labelling takes against the training it feeds.

recipes/digits_teacher.toml is prepared once; unlabeled shards (its board shards, tiled) are laid
out in an agent root and one job runs in the torch-free board venv: the agent labels the shards
with the teacher (ORT inference, ``teacher.batch_size`` rows at a time), then trains the student on
the labels. The same job then runs again on the same shards with labels already present (a
labeled copy: no teacher work), so the two peaks and durations compare in one run.

    .venv/bin/python bench/teacher.py            # 8 shards of 1000 digits, batch 64 and 1
    .venv/bin/python bench/teacher.py --quick    # 2 shards of 250, batch 64 (the smoke test)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, install_job, run_agent, table, write_results  # noqa: E402
from tasks.paths import PROJECT_ROOT, state_dir  # noqa: E402

RECIPE = PROJECT_ROOT / "recipes" / "digits_teacher.toml"
COLUMNS = [("case", "case"), ("samples", "samples"), ("teacher_s", "label s"), ("label_per_s", "label/s"),
           ("train_s", "train s"), ("steps_per_s", "steps/s"), ("label_over_train", "label/train"),
           ("teacher_peak_mb", "teacher peak MB"), ("peak_rss_mb", "job peak MB"), ("estimate_mb", "estimate MB")]  # fmt: skip


def _shards(folder: Path, count: int, rows: int, labeled: bool) -> list[Any]:
    """``count`` shards of ``rows`` shifted digits (tiled from the recipe's board shards)."""
    import numpy as np

    from device_agent.protocol import DataFile, file_sha256

    data = PROJECT_ROOT / "recipes" / "data" / "digits-teacher"
    x = np.concatenate([np.load(data / "shards" / f"shard-000{i}.npz")["x"] for i in (1, 2)])
    y = np.concatenate([np.load(data / "truth" / f"shard-000{i}.npz")["y"] for i in (1, 2)])
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    pins = []
    rng = np.random.default_rng(0)
    for i in range(count):
        idx = rng.integers(0, len(x), rows)
        arrays = {"x": x[idx]} | ({"y": y[idx]} if labeled else {})
        path = folder / f"shard-{i:04d}.npz"
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)
        pins.append(DataFile(path.name, file_sha256(path), path.stat().st_size, rows))
    return pins


def measure(prepared: Any, recipe: Any, count: int, rows: int, batch: int, labeled: bool) -> dict[str, Any]:
    from device_agent.protocol import DataRef
    from tasks.prepare.board_job import build_job_spec

    root = state_dir("cache", "bench", "teacher-root")
    name = f"bench-{'labeled' if labeled else 'unlabeled'}"
    pins = _shards(root / "datasets" / name, count, rows, labeled)
    ref = DataRef("npz-shards", path=f"datasets/{name}", files=tuple(pins))
    spec, files = build_job_spec(recipe, prepared, f"{name}-b{batch}", train_data=ref)
    spec = replace(spec, teacher=replace(spec.teacher, batch_size=batch))
    result = run_agent(BOARD_VENV / "bin" / "python", root, install_job(root, spec, files))
    t = result.get("teacher") or {}
    train_s = float(result["train_loop_s"])
    label_s = float(t.get("seconds") or 0.0)
    return {
        "case": f"{'labeled, no teacher work' if labeled else 'teacher'} (batch {batch})",
        "samples": count * rows,
        "teacher_s": round(label_s, 3),
        "label_per_s": t.get("samples_per_s") or "-",
        "train_s": round(train_s, 3),
        "steps_per_s": round(result["steps"] / train_s, 1) if train_s else "-",
        "label_over_train": round(label_s / train_s, 3) if train_s and label_s else "-",
        "teacher_peak_mb": t.get("teacher_peak_rss_mb") or "-",
        "peak_rss_mb": result["peak_rss_mb"],
        "estimate_mb": round(spec.memory_estimate_mb + (prepared.validation or {}).get("checks", {}).get("teacher", {}).get("teacher_mb", 0), 1),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("ODL_HOME", str(state_dir("cache", "bench", "home")))
    from tasks import stages
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(RECIPE, {"training.epochs": 1})
    stages.prepare_data(recipe)
    prepared = prepare(recipe, state_dir("cache", "bench", "teacher-prepared"))
    count, rows, batches = (2, 250, (64,)) if args.quick else (8, 1000, (64, 1))
    rows_out = [measure(prepared, recipe, count, rows, b, labeled=False) for b in batches]
    rows_out.append(measure(prepared, recipe, count, rows, batches[0], labeled=True))
    print(table(rows_out, COLUMNS))
    teacher, plain = rows_out[0], rows_out[-1]
    ratios = {"peak_with_teacher_over_without": round(teacher["peak_rss_mb"] / plain["peak_rss_mb"], 3)}
    print(f"job peak RSS with the teacher / without: {ratios['peak_with_teacher_over_without']}")
    path = write_results("teacher", {"rows": rows_out, "ratios": ratios, "quick": args.quick}, args.out)
    print(f"figures written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
