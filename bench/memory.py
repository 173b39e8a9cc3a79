"""Validation's predicted board peak RAM vs the measured peak RSS of the agent, mobilenet_v2, batch 1-32.

The recipe is prepared once (the exported graphs have a dynamic batch axis); for each batch size
the offline validation (tasks.prepare.validation.validate, with ``training.batch_size`` overridden) predicts
``board_peak_estimate_mb``, then the device agent trains one epoch of the recipe's own 256
training images at that batch size in the torch-free board venv, and its ``result.json``
``peak_rss_mb`` (VmHWM) is the measured peak. Prints estimate / measured per batch size (target:
within +-20 %) and writes bench/results/memory.json.

    .venv/bin/python bench/memory.py            # batch sizes 1, 2, 4, 8, 16, 32
    .venv/bin/python bench/memory.py --quick    # recipes/digits.toml, batch size 2, 8 steps (the smoke test)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, install_job, run_agent, table, write_results  # noqa: E402
from tasks.paths import PROJECT_ROOT, state_dir  # noqa: E402

RECIPE = PROJECT_ROOT / "recipes" / "mobilenet_v2.toml"
QUICK_RECIPE = PROJECT_ROOT / "recipes" / "digits.toml"  # the smoke test's: prepares in seconds, not ~40 s
BATCHES = (1, 2, 4, 8, 16, 32)
TOLERANCE = 0.20
COLUMNS = [("batch_size", "batch"), ("estimate_mb", "estimate MB"), ("probe_peak_mb", "probe MB"),
           ("agent_peak_mb", "agent MB"), ("probe_ratio", "probe/agent"), ("ratio", "estimate/agent"), ("within", "within 20%")]  # fmt: skip


def prepare_once(path: Path = RECIPE) -> Any:
    """Export + artifacts of the recipe at ``path`` (no validation) in a bench cache folder; returns Prepared."""
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(path)
    return prepare(recipe, state_dir("cache", "bench", "memory-prepared"), validate=False)


def measure_batch(
    prepared: Any, batch: int, python: Path, max_steps: int, path: Path = RECIPE
) -> dict[str, Any]:
    """Validation's estimate and the agent's measured peak at one batch size."""
    from tasks.prepare.board_job import build_job_spec
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(path, {"training.batch_size": batch, "training.epochs": 1})
    report = validation_report(recipe, prepared)
    spec, files = build_job_spec(
        recipe, replace(prepared, validation=report), f"bench-memory-b{batch}", max_steps=max_steps
    )
    root = state_dir("cache", "bench", "memory-root")
    result = run_agent(python, root, install_job(root, spec, files))
    estimate, measured = float(report["board_peak_estimate_mb"]), float(result["peak_rss_mb"])
    return {
        "batch_size": batch,
        "estimate_mb": round(estimate, 1),
        "probe_peak_mb": round(float(report["measured_peak_rss_mb"]), 1),
        "agent_peak_mb": round(measured, 1),
        "probe_ratio": round(float(report["measured_peak_rss_mb"]) / measured, 3),
        "ratio": round(estimate / measured, 3),
        "within": abs(estimate / measured - 1) <= TOLERANCE,
        "agent_steps": result["steps"],
        "validation": "passed"
        if report["passed"]
        else f"failed {report['failed_check']} (estimate from its probe)",
    }


def validation_report(recipe: Any, prepared: Any) -> dict[str, Any]:
    """``tasks.validate.validate`` at the recipe's batch size; when only the 'loss falls on a repeated
    batch' check fails (tiny batches with BatchNorm are noisy), the estimate of its training probe."""
    from tasks.errors import ValidationFailed
    from tasks.prepare.validation.validate import _figures, run_probe, validate

    try:
        return validate(recipe, prepared.out_dir)
    except ValidationFailed as exc:
        if exc.check != "loss_falls":
            raise
        probe = run_probe(recipe, prepared.out_dir, prepared.manifest, 5)
        return {**_figures(recipe, probe, prepared.manifest), "passed": False, "failed_check": exc.check}


def main() -> int:
    """Run the batch sizes, print the table, write bench/results/memory.json."""
    from tasks.vboard.venv import ensure_board_venv

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="recipes/digits.toml, batch size 2 only, 8 steps"
    )
    parser.add_argument("--out", type=Path, help="result file (default bench/results/memory.json)")
    args = parser.parse_args()
    python = ensure_board_venv(BOARD_VENV)
    recipe, batches, max_steps = (QUICK_RECIPE, (2,), 8) if args.quick else (RECIPE, BATCHES, 0)
    prepared = prepare_once(recipe)
    rows = [measure_batch(prepared, b, python, max_steps, recipe) for b in batches]
    path = write_results(
        "memory", {"recipe": recipe.name, "tolerance": TOLERANCE, "quick": args.quick, "rows": rows}, args.out
    )
    print(table(rows, COLUMNS))
    print(f"target: estimate within +-{TOLERANCE:.0%} of the agent's measured peak RSS; figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
