"""Fleet benchmark: federated rounds over N = 1, 2, 4, 8 virtual boards, and what they buy.

Each virtual board is CPU-limited by a kernel quota (``--cpu-quota``, default 0.25 CPU: eight
boards fit this machine's 2 cores), so a board trains as fast with 8 boards up as with 1, as real
boards would; what grows with N is the host's work. Per N it prints the wall time per round, the
host overhead per board ((round wall time - the slowest board's own job time) / N: fan-out,
SSH, downloads, aggregation and host evaluation) and the bytes moved per round.

Accuracy on the host test set (197 shifted digits), for the 4-board non-IID split (Dirichlet 0.5
over labels, recipes/datasets.py:noniid_split) unless --split says otherwise:
* federated: the aggregate after --rounds FedAvg rounds of --epochs local epochs;
* local: each board alone, rounds x epochs epochs on its own data;
* centralised: one board holding all 700 samples, rounds x epochs epochs.
Every figure comes from the fleet flow itself (flows/fleet.py) (a Prefect test API in process).

    .venv/bin/python bench/fleet.py                  # N = 1, 2, 4, 8; ~15 min
    .venv/bin/python bench/fleet.py --quick          # N = 1, 2; 1 round (a smoke run)
"""

from __future__ import annotations

import argparse
import posixpath
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, odl_home, table, write_results  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

RECIPE = PROJECT_ROOT / "recipes" / "digits_fleet.toml"
DATA = PROJECT_ROOT / "recipes" / "data" / "digits-fleet"


def give_data(board, split: int, index: int) -> None:  # noqa: ANN001
    """Replace the board's datasets/digits with its share of the ``split``-board split."""
    from tasks.board.transport import connect

    conn = connect(board)
    try:
        folder = posixpath.join(board.root, "datasets", "digits")
        conn.run(["rm", "-rf", folder])
        conn.run(["mkdir", "-p", folder])
        conn.put(DATA / f"boards-{split}" / f"board-{index}.npz", posixpath.join(folder, f"split{split}.npz"))
    finally:
        conn.close()


def fleet_run(group: str, rounds: int, epochs: int) -> dict:
    from flows.fleet import FleetParams, odl_fleet

    params = FleetParams(group=group, rounds=rounds, epochs=epochs, overrides={"promotion.rollout": False})
    state = odl_fleet(params, return_state=True)
    if not state.is_completed():
        raise SystemExit(f"fleet run on {group} failed: {state.message}")
    return state.result().summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--split", type=int, default=4, help="the split whose local models are trained")
    ap.add_argument("--cpu-quota", type=float, default=0.25)
    ap.add_argument("--quick", action="store_true", help="N = 1, 2; one round; split 2")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sizes = [1, 2] if args.quick else [int(s) for s in args.sizes.split(",")]
    rounds, split = (1, 2) if args.quick else (args.rounds, args.split)

    from prefect.testing.utilities import prefect_test_harness

    from tasks import stages
    from tasks.board.inventory import save_group
    from tasks.recipe.load import load_recipe
    from tasks.vboard.lifecycle import board_down, board_up

    stages.prepare_data(load_recipe(RECIPE))
    home = Path(tempfile.mkdtemp(prefix="odl-bench-fleet-"))
    names = [f"fb{i}" for i in range(max(sizes + [split]))]
    rows, acc = [], {}
    with odl_home(home), prefect_test_harness(server_startup_timeout=120):
        boards = [board_up(n, venv=BOARD_VENV, cpu_quota=args.cpu_quota) for n in names]
        try:
            for n in sizes:
                for i in range(n):
                    give_data(boards[i], n, i)
                save_group(f"n{n}", names[:n])
                t0 = time.monotonic()
                summary = fleet_run(f"n{n}", rounds, args.epochs)
                recs = summary["rounds"]
                walls = [r["wall_s"] for r in recs]
                slowest = [
                    max(b["train_s"] for b in r["boards"].values() if b["status"] == "ok") for r in recs
                ]
                rows.append({
                    "boards": n,
                    "round_s": sum(walls) / len(walls),
                    "slowest_board_s": sum(slowest) / len(slowest),
                    "host_overhead_per_board_s": sum(w - s for w, s in zip(walls, slowest, strict=True)) / len(walls) / n,
                    "host_eval_s": sum(r["host_seconds"] for r in recs) / len(recs),
                    "bytes_up_per_round": sum(r["bytes_up"] for r in recs) / len(recs),
                    "bytes_down_per_round": sum(r["bytes_down"] for r in recs[1:] or recs) / max(1, len(recs[1:] or recs)),
                    "tensor_bytes": recs[0]["tensor_bytes"],
                    "federated_accuracy": recs[-1]["aggregate"]["accuracy"],
                    "run_s": time.monotonic() - t0,
                })  # fmt: skip
                print(table(rows[-1:], [(k, k) for k in rows[-1]]), flush=True)
            # local models of the chosen split, and centralised training, with the same epoch budget
            total = rounds * args.epochs
            for i in range(split):
                give_data(boards[i], split, i)
                save_group(f"local{i}", [names[i]])
                acc[f"local {names[i]}"] = fleet_run(f"local{i}", 1, total)["rounds"][0]["aggregate"][
                    "accuracy"
                ]
            give_data(boards[0], 1, 0)
            save_group("central", [names[0]])
            acc["centralised"] = fleet_run("central", 1, total)["rounds"][0]["aggregate"]["accuracy"]
            acc["federated"] = next(r["federated_accuracy"] for r in rows if r["boards"] == split)
        finally:
            for n in names:
                board_down(n, purge=True)
            shutil.rmtree(home, ignore_errors=True)
    print()
    print(table(rows, [("boards", "N"), ("round_s", "s/round"), ("slowest_board_s", "slowest board s"),
                       ("host_overhead_per_board_s", "host s/board"), ("host_eval_s", "host eval s"),
                       ("bytes_up_per_round", "up B/round"), ("bytes_down_per_round", "down B/round"),
                       ("federated_accuracy", "fed acc")]))  # fmt: skip
    print()
    print(
        f"accuracy on the host test set, {split}-board non-IID split, {rounds * args.epochs} epochs of budget:"
    )
    print(
        table(
            [{"model": k, "accuracy": v} for k, v in acc.items()],
            [("model", "model"), ("accuracy", "accuracy")],
        )
    )
    beats = all(acc["federated"] > v for k, v in acc.items() if k.startswith("local"))
    print(
        f"federated beats every local model: {beats}; federated / centralised = {acc['federated'] / acc['centralised']:.3f}"
    )
    figures = {"rows": rows, "accuracy": acc, "rounds": rounds, "epochs": args.epochs, "split": split,
               "cpu_quota": args.cpu_quota, "federated_beats_every_local": beats}  # fmt: skip
    print(f"figures: {write_results('fleet', figures, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
