"""End to end through the Prefect flow ``odl``: time per stage and orchestration overhead.

Brings up a throw-away virtual board in a temporary ODL_HOME and a temporary Prefect API
(``prefect_test_harness``, its own PREFECT_HOME), then runs the flow in this process twice per
recipe: a cold run (export, artifacts, validation, full upload) and a second run with unchanged
inputs (cached stages, 0 bytes uploaded; training always runs). For each run it prints the
seconds per stage, the board's training-loop time (``result.json`` ``train_loop_s``) and the
orchestration overhead = total - training loop, as a share of the total (target for
mobilenet_v2 at 3 epochs of 256 samples: <= 15 %). Prefect's own fixed cost is measured apart
with a no-op flow and no-op tasks under the same API. Figures go to bench/results/e2e.json.

    .venv/bin/python bench/e2e.py            # digits (10 epochs) and mobilenet_v2 (3 epochs)
    .venv/bin/python bench/e2e.py --quick    # digits only, 2 epochs, Prefect's cost best of 2 (the smoke test)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import table, virtual_board, write_results  # noqa: E402

TARGET_SHARE = 0.15
BACKOFF_RE = re.compile(r"retryable status code (\d+)\. Another attempt will be made in ([0-9.]+)s")
PREFECT_TASKS = 9  # prepare data, export, generate artifacts, validate recipe, deploy, train, retrieve,
# evaluate, promote
FULL = [("recipes/digits.toml", {}), ("recipes/mobilenet_v2.toml", {"training.epochs": 3})]
QUICK = [("recipes/digits.toml", {"training.epochs": 2})]
COLUMNS = [("recipe", "recipe"), ("run", "run"), ("prepare data", "data"), ("export", "export"), ("generate artifacts", "artifacts"),
           ("validate recipe", "validate"), ("deploy", "deploy"), ("train", "train"), ("retrieve", "retrieve"),
           ("evaluate", "evaluate"), ("promote", "promote"), ("outside_stages_s", "flow body"),
           ("total_s", "total"), ("train_loop_s", "board loop"), ("overhead_share", "overhead"), ("prefect_backoff_s", "503 wait"),
           ("bytes_uploaded", "bytes up")]  # fmt: skip


class RunLog(logging.Handler):
    """Collects what ``tasks.board.blobs.upload_blobs`` reports (its 'uploaded N blob(s), B bytes' line)
    and the back-off sleeps of Prefect's client (the API answers 503 while SQLite is locked)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.bytes, self.uploaded, self.skipped = 0, 0, 0
        self.backoff_s, self.retries = 0.0, 0

    def emit(self, record: logging.LogRecord) -> None:
        """Add the counts of one upload report or one client retry."""
        backoff = BACKOFF_RE.search(record.getMessage())
        if record.name.startswith("prefect") and backoff:
            self.backoff_s, self.retries = self.backoff_s + float(backoff.group(2)), self.retries + 1
        elif isinstance(record.msg, str) and record.msg.startswith("board %s: uploaded") and record.args:
            _, uploaded, sent, skipped = record.args  # type: ignore[misc]
            self.uploaded, self.bytes, self.skipped = (
                self.uploaded + uploaded,
                self.bytes + sent,
                self.skipped + skipped,
            )


def run_flow(recipe: str, board: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """One in-process run of flow ``odl``; returns stage seconds, board loop time and overhead."""
    from flows.odl import OdlParams, odl

    handler = RunLog()
    with _capture(handler, {"tasks.board": logging.INFO, "prefect.client": logging.DEBUG}):
        t0 = time.perf_counter()
        state = odl(OdlParams(recipe=recipe, board=board, overrides=overrides), return_state=True)
        total = time.perf_counter() - t0
    if not state.is_completed():
        raise SystemExit(f"flow run of {recipe} failed: {state.message}")
    out = state.result()
    job_id = out.job_id
    result = json.loads((out.run_dir / "result.json").read_text())
    stages = {k.split(" to ")[0].split(" on ")[0]: round(v, 3) for k, v in out.timings.items()}
    loop = float(result["train_loop_s"])
    return {
        **stages,
        "total_s": round(total, 3),
        "train_loop_s": round(loop, 3),
        "overhead_s": round(total - loop, 3),
        "overhead_share": round((total - loop) / total, 3),
        "overhead_without_evaluate_share": round((total - loop - stages["evaluate"]) / total, 3),
        "outside_stages_s": round(total - sum(out.timings.values()), 3),
        "train_stage_minus_loop_s": round(stages["train"] - loop, 3),
        # agent side: session load, checkpoints, inference export; host side: SSH, job start, polling
        "agent_outside_loop_s": round(float(result["duration_s"]) - loop, 3),
        "host_side_of_train_s": round(stages["train"] - float(result["duration_s"]), 3),
        "steps": result["steps"],
        "bytes_uploaded": handler.bytes,
        "blobs_uploaded": handler.uploaded,
        "blobs_skipped": handler.skipped,
        "prefect_retries": handler.retries,
        "prefect_backoff_s": round(handler.backoff_s, 3),
        "job_id": job_id,
    }


@contextlib.contextmanager
def _capture(handler: logging.Handler, levels: dict[str, int]) -> Iterator[None]:
    loggers = {
        logging.getLogger(name): (level, logging.getLogger(name).level) for name, level in levels.items()
    }
    for logger, (level, _) in loggers.items():
        logger.setLevel(level)
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger, (_, old) in loggers.items():
            logger.removeHandler(handler)
            logger.setLevel(old)


def prefect_fixed_cost(repeat: int = 5) -> dict[str, float]:
    """Seconds of an empty flow run, and per extra no-op task run, under the current Prefect API."""
    from prefect import flow, task

    @task(name="noop")
    def noop() -> None:
        return None

    @flow(name="bench-noop")
    def noop_flow(n: int) -> None:
        for _ in range(n):
            noop()

    noop_flow(1)  # warm-up (first flow run registers the flow)
    empty, full = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        noop_flow(0)
        empty.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        noop_flow(PREFECT_TASKS)
        full.append(time.perf_counter() - t0)
    flow_s = min(empty)  # the minimum: runs without a SQLite back-off (their medians are kept too)
    per_task = (min(full) - flow_s) / PREFECT_TASKS
    return {
        "empty_flow_s": round(flow_s, 3),
        "per_task_s": round(per_task, 4),
        "flow_with_tasks_s": round(min(full), 3),
        "median_empty_flow_s": round(statistics.median(empty), 3),
        "median_flow_with_tasks_s": round(statistics.median(full), 3),
    }


def measure(runs: list[tuple[str, dict[str, Any]]], board: str, repeat: int = 5) -> dict[str, Any]:
    """Cold then unchanged run of each recipe, and Prefect's fixed cost (best of ``repeat``), under a
    temporary Prefect API."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    rows = []
    with prefect_test_harness(server_startup_timeout=120):
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            for recipe, overrides in runs:
                for label in ("cold", "unchanged"):
                    row = run_flow(recipe, board, overrides)
                    rows.append({"recipe": Path(recipe).stem, "run": label, "overrides": overrides, **row})
            prefect = prefect_fixed_cost(repeat)
    return {"runs": rows, "prefect_noop": prefect}


def main() -> int:
    """Run the benchmark, print the table, write bench/results/e2e.json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="digits only, 2 epochs, Prefect's fixed cost best of 2"
    )
    parser.add_argument("--out", type=Path, help="result file (default bench/results/e2e.json)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="odl-bench-e2e-"))
    os.environ.update(
        ODL_HOME=str(home),
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="1",
    )
    try:
        with virtual_board("be") as board:
            runs, repeat = (QUICK, 2) if args.quick else (FULL, 5)
            figures = measure(runs, board.name, repeat)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    figures.update(quick=args.quick, target_share=TARGET_SHARE)
    path = write_results("e2e", figures, args.out)
    print(table(figures["runs"], COLUMNS))
    noop = figures["prefect_noop"]
    print(
        f"Prefect alone (no-op flow + {PREFECT_TASKS} no-op tasks): {noop['flow_with_tasks_s']} s "
        f"(empty flow {noop['empty_flow_s']} s, {noop['per_task_s']} s per task)"
    )
    print(f"overhead = (total - board training loop) / total; target <= {TARGET_SHARE} (mobilenet_v2)")
    print("503 wait = seconds Prefect's client slept after 503 answers of its API (SQLite locked)")
    print(f"figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
