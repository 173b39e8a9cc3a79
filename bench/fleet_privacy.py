"""Differential privacy on the fleet reference: aggregate accuracy against ε.

The fleet reference of ``make fleet`` (recipes/digits_fleet.toml: 4 boards, each with its share of
the 4-board non-IID split, FedAvg, --rounds rounds of --epochs local epochs) run through the fleet
flow (flows/fleet.py, a Prefect test API in process) on local-transport boards, without privacy and
then with ``[fleet.privacy]`` at each noise multiplier of --noise, central and local, each board's
update clipped to --clip. ε is the accountant's (Opacus RDP) for δ = --delta after the rounds run;
the target is the schema's largest, 1000 (a noise multiplier whose ε passes it stops early). Each figure is the mean over
--repeats runs (the noise differs each run).

    .venv/bin/python bench/fleet_privacy.py                   # ~15 min on this machine
    .venv/bin/python bench/fleet_privacy.py --quick           # 2 boards, 1 round, z = 1 central (a smoke run)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, odl_home, table, write_results  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

RECIPE = PROJECT_ROOT / "recipes" / "digits_fleet.toml"
DATA = PROJECT_ROOT / "recipes" / "data" / "digits-fleet"


def local_boards(home: Path, n: int) -> None:
    """Boards pb0..pb<n-1> (local transport, the tests' board venv), each with its share of the
    ``n``-board split, in group ``priv``."""
    from tasks.board.inventory import Board, save_board, save_group
    from tasks.vboard.venv import ensure_board_venv

    python = ensure_board_venv(BOARD_VENV)
    for i in range(n):
        root = home / f"board-pb{i}"
        (root / "datasets" / "digits").mkdir(parents=True)
        shutil.copy(DATA / f"boards-{n}" / f"board-{i}.npz", root / "datasets" / "digits" / "part-1.npz")
        save_board(Board(name=f"pb{i}", transport="local", root=str(root), python=str(python)))
    save_group("priv", [f"pb{i}" for i in range(n)])


def fleet_run(rounds: int, epochs: int, privacy: dict | None) -> dict:
    """One fleet run's summary (no promotion rollout)."""
    from flows.fleet import FleetParams, odl_fleet

    overrides: dict = {"promotion.rollout": False}
    if privacy:
        overrides["fleet.privacy"] = privacy
    params = FleetParams(group="priv", rounds=rounds, epochs=epochs, overrides=overrides)
    state = odl_fleet(params, return_state=True)
    if not state.is_completed():
        raise SystemExit(f"fleet run failed: {state.message}")
    return state.result().summary


def settings(args: argparse.Namespace) -> list[dict | None]:
    """No privacy first, then each mode at each noise multiplier."""
    out: list[dict | None] = [None]
    for mode in args.modes.split(","):
        for z in (float(v) for v in args.noise.split(",")):
            out.append({"mode": mode, "noise_multiplier": z, "clip": args.clip, "delta": args.delta,
                        "target_epsilon": 1000.0})  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boards", type=int, default=4, choices=(1, 2, 4, 8))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--clip", type=float, default=1.0, help="L2 bound of each board's update")
    ap.add_argument("--noise", default="0.05,0.1,0.3,1", help="noise multipliers, comma-separated")
    ap.add_argument("--modes", default="central,local")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 boards, 1 round of 1 epoch, z = 1 central, once")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.boards, args.rounds, args.epochs, args.noise, args.modes, args.repeats = (
            2,
            1,
            1,
            "1",
            "central",
            1,
        )

    from prefect.testing.utilities import prefect_test_harness

    from tasks import stages
    from tasks.recipe.load import load_recipe

    stages.prepare_data(load_recipe(RECIPE))
    home = Path(tempfile.mkdtemp(prefix="odl-bench-privacy-"))
    rows = []
    try:
        with odl_home(home), prefect_test_harness(server_startup_timeout=120):
            local_boards(home, args.boards)
            for privacy in settings(args):
                t0, accs, eps, norms = time.monotonic(), [], None, []
                for _ in range(args.repeats if privacy else 1):
                    summary = fleet_run(args.rounds, args.epochs, privacy)
                    accs.append(summary["rounds"][-1]["aggregate"]["accuracy"])
                    eps = (summary.get("privacy") or {}).get("epsilon")
                    norms += [b["update"]["norm"] for r in summary["rounds"] for b in r["boards"].values()
                              if b.get("update")]  # fmt: skip
                rows.append({
                    "mode": privacy["mode"] if privacy else "none",
                    "noise_multiplier": privacy["noise_multiplier"] if privacy else 0.0,
                    "epsilon": f"{eps:.3g}" if eps is not None else "inf",
                    "rounds_run": len(summary["rounds"]),
                    "accuracy": statistics.mean(accs),
                    "accuracy_min": min(accs),
                    "update_norm_median": statistics.median(norms),
                    "run_s": (time.monotonic() - t0) / len(accs),
                })  # fmt: skip
                print(table(rows[-1:], [(k, k) for k in rows[-1]]), flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print()
    print(f"{args.boards} boards, {args.rounds} rounds x {args.epochs} epochs, clip {args.clip:g}, "
          f"delta {args.delta:g}, mean of {args.repeats} runs per private setting:")  # fmt: skip
    print(table(rows, [("mode", "mode"), ("noise_multiplier", "z"), ("epsilon", "ε"), ("rounds_run", "rounds"),
                       ("accuracy", "accuracy"),
                       ("accuracy_min", "min"), ("update_norm_median", "median update norm")]))  # fmt: skip
    figures = {"rows": rows, "boards": args.boards, "rounds": args.rounds, "epochs": args.epochs,
               "clip": args.clip, "delta": args.delta, "repeats": args.repeats}  # fmt: skip
    print(f"figures: {write_results('fleet_privacy', figures, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
