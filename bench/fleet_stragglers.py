"""Stragglers: synchronous rounds vs the buffered asynchronous mode (FedBuff) with one slow board.

N virtual boards (``--boards``, 4 or 8) hold the recipe's N-board non-IID split of the shifted
digits; each is capped at ``--cpu-quota`` CPU by a kernel quota, except the last, capped at
``--cpu-quota / --slowdown`` (default 5x slower: everything it runs, SSH sessions, the agent's
start and its training). The fleet flow (flows/fleet.py, a Prefect test API in process) then runs

* ``rounds``: ``--rounds`` synchronous FedAvg rounds (each waits for every board, the slow one too);
* ``buffered K``: ``[fleet] mode = "buffered"``, ``buffer_size`` K for each K of ``--buffers``,
  ``--aggregations`` aggregations, staleness weight 1 / sqrt(1 + staleness) (FedBuff's);

all with ``--epochs`` local epochs per job. Every aggregate is evaluated on the host test set (197
shifted digits, base model 0.294) as it is made, with its time since the run's start
(``elapsed_s``: after the model is prepared, before the first board is asked). Printed: seconds to
reach each accuracy of ``--targets`` per mode, and their ratio (rounds / buffered); per buffered
aggregation, which boards arrived and their staleness. A warm-up run first puts the training
artifacts on every board, so neither measured run pays for the upload.

    nice -n 19 .venv/bin/python bench/fleet_stragglers.py               # N = 4, ~10 min
    nice -n 19 .venv/bin/python bench/fleet_stragglers.py --boards 8
    .venv/bin/python bench/fleet_stragglers.py --quick                  # N = 2, a smoke run
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, odl_home, table, write_results  # noqa: E402
from bench.fleet import give_data  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

RECIPE = PROJECT_ROOT / "recipes" / "digits_fleet.toml"
SPLITS = PROJECT_ROOT / "recipes" / "data" / "digits-fleet"


def fleet_run(rounds: int, epochs: int, overrides: dict) -> dict:
    """One fleet run over group ``str`` (no rollout); its summary."""
    from flows.fleet import FleetParams, odl_fleet

    params = FleetParams(
        group="str", rounds=rounds, epochs=epochs, overrides={"promotion.rollout": False, **overrides}
    )
    state = odl_fleet(params, return_state=True)
    if not state.is_completed():
        raise SystemExit(f"fleet run failed: {state.message}")
    return state.result().summary


def curve(summary: dict) -> list[tuple[float, float]]:
    """(seconds since the run's start, aggregate accuracy) per aggregation."""
    return [(r["elapsed_s"], r["aggregate"]["accuracy"]) for r in summary["rounds"] if r.get("aggregate")]


def time_to(points: list[tuple[float, float]], target: float) -> float:
    """Seconds until the aggregate first reached ``target`` (nan if it never did)."""
    return next((t for t, acc in points if acc >= target), float("nan"))


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(f"signal {signum}")  # a SIGTERM still purges the boards (the finally below)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boards", type=int, default=4, choices=(2, 4, 8))
    ap.add_argument("--cpu-quota", type=float, default=0.25, help="CPU of each fast board")
    ap.add_argument("--slowdown", type=float, default=5.0, help="the last board gets cpu-quota / slowdown")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4, help="synchronous rounds")
    ap.add_argument("--aggregations", type=int, default=10, help="buffered aggregations")
    ap.add_argument("--buffers", default="2,3", help="buffer sizes K to run")
    ap.add_argument("--targets", default="0.6,0.7")
    ap.add_argument("--quick", action="store_true", help="2 boards, 1 round, 2 aggregations of K = 1")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.boards, args.rounds, args.aggregations, args.buffers, args.epochs = 2, 1, 2, "1", 1
    buffers = [int(k) for k in args.buffers.split(",")]
    targets = [float(t) for t in args.targets.split(",")]
    if not all(1 <= k <= args.boards for k in buffers):
        raise SystemExit(f"--buffers: each K in 1..{args.boards} (the boards)")
    signal.signal(signal.SIGTERM, _stop)

    from prefect.testing.utilities import prefect_test_harness

    from tasks import stages
    from tasks.board.inventory import save_group
    from tasks.recipe.load import load_recipe
    from tasks.vboard.lifecycle import board_down, board_up

    stages.prepare_data(load_recipe(RECIPE))
    home = Path(tempfile.mkdtemp(prefix="odl-bench-stragglers-"))
    n = args.boards
    names = [f"sb{i}" for i in range(n)]
    slow_quota = args.cpu_quota / args.slowdown
    runs: dict[str, dict] = {}
    try:
        with odl_home(home), prefect_test_harness(server_startup_timeout=120):
            try:
                for i, name in enumerate(names):
                    quota = slow_quota if i == n - 1 else args.cpu_quota
                    give_data(board_up(name, venv=BOARD_VENV, cpu_quota=quota), SPLITS, n, i)
                save_group("str", names)
                t0 = time.monotonic()
                fleet_run(1, 1, {})  # warm-up: the artifacts go up to every board once
                print(f"warm-up round: {time.monotonic() - t0:.1f} s", flush=True)
                runs["rounds"] = fleet_run(args.rounds, args.epochs, {})
                print(f"rounds: {curve(runs['rounds'])}", flush=True)
                for k in buffers:
                    overrides = {"fleet.mode": "buffered", "fleet.buffer_size": k}
                    runs[f"buffered K={k}"] = fleet_run(args.aggregations, args.epochs, overrides)
                    print(f"buffered K={k}: {curve(runs[f'buffered K={k}'])}", flush=True)
            finally:
                for name in names:
                    board_down(name, purge=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)

    rows = []
    for mode, summary in runs.items():
        points = curve(summary)
        row = {"mode": mode, "aggregations": len(points), "s_per_aggregation": points[-1][0] / len(points),
               "final_accuracy": points[-1][1], "best_accuracy": max(a for _, a in points), "last_s": points[-1][0]}  # fmt: skip
        for t in targets:
            row[f"t{t}"] = time_to(points, t)
            row[f"ratio{t}"] = time_to(curve(runs["rounds"]), t) / row[f"t{t}"]
        rows.append(row)
    print()
    print(
        f"{n} boards ({names[-1]} at {slow_quota:g} CPU, the others at {args.cpu_quota:g}), {args.epochs} epochs per job:"
    )
    cols = [("mode", "mode"), ("aggregations", "aggregations"), ("s_per_aggregation", "s / aggregation"),
            ("best_accuracy", "best acc"), ("final_accuracy", "final acc")]  # fmt: skip
    for t in targets:
        cols += [(f"t{t}", f"s to {t:g}"), (f"ratio{t}", f"rounds / this at {t:g}")]
    print(table(rows, cols))
    for mode, summary in runs.items():
        if mode == "rounds":
            continue
        print(f"\n{mode}: arrivals (board: staleness) per aggregation")
        for rec in summary["rounds"]:
            got = ", ".join(f"{b}: {rec['boards'][b]['staleness']}" for b in rec["arrivals"])
            print(
                f"  {rec['round']:2d}  {rec['elapsed_s']:6.1f} s  acc {rec['aggregate']['accuracy']:.3f}  {got}"
            )
    slow = names[-1]
    arrivals = {
        mode: sum(slow in r["arrivals"] for r in s["rounds"]) for mode, s in runs.items() if mode != "rounds"
    }
    print(f"\n{slow}'s updates in the buffered runs: {arrivals}")
    figures = {"rows": rows, "curves": {m: curve(s) for m, s in runs.items()}, "boards": n,
               "cpu_quota": args.cpu_quota, "slow_quota": slow_quota, "epochs": args.epochs,
               "arrivals": {m: [[(b, r["boards"][b]["staleness"]) for b in r["arrivals"]] for r in s["rounds"]]
                            for m, s in runs.items() if m != "rounds"}}  # fmt: skip
    print(f"figures: {write_results('fleet_stragglers', figures, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
