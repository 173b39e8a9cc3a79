"""Fleet benchmark: federated rounds over N virtual boards (any N), and what they buy.

Each virtual board is CPU-limited by a kernel quota (``--cpu-quota``, default 0.25 CPU: eight
boards fit this machine's 2 cores), so a board trains as fast with 8 boards up as with 1, as real
boards would; what grows with N is the host's work. Per N it prints the wall time per round, the
host overhead per board ((round wall time - the slowest board's own job time) / N: fan-out,
SSH, downloads, aggregation and host evaluation), the host's CPU seconds and peak memory (this
process, which runs the flow, plus the Prefect server it started: /proc, no psutil) and the bytes
moved per round.

Each N gets its own non-IID split of the fleet's 700 shifted digits (Dirichlet ``--alpha`` over
labels, recipes/datasets.py:fleet_split, seeded by N: at alpha 0.5 the splits of N = 1, 2, 4, 8 are
the recipe's own ``boards-N`` files); every board holds at least min(10, 700 // 2N) samples
(5 at N = 64), topped up from the largest board when the draw left it fewer.

Accuracy on the host test set (197 shifted digits), for the 4-board split unless --split says
otherwise (``--split 0``: no accuracy part, the scale figures only):
* federated: the aggregate after --rounds FedAvg rounds of --epochs local epochs;
* local: each board alone, rounds x epochs epochs on its own data;
* centralised: one board holding all 700 samples, rounds x epochs epochs.
Every figure comes from the fleet flow itself (flows/fleet.py) (a Prefect test API in process).

    .venv/bin/python bench/fleet.py                  # N = 1, 2, 4, 8; ~15 min
    .venv/bin/python bench/fleet.py --quick          # N = 1, 2; 1 round (a smoke run)
    nice -n 19 .venv/bin/python bench/fleet.py --sizes 1,8,16,32,64 --split 0 --cpu-quota 0.05
"""

from __future__ import annotations

import argparse
import os
import posixpath
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, odl_home, table, write_results  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

RECIPE = PROJECT_ROOT / "recipes" / "digits_fleet.toml"


def give_data(board, splits: Path, split: int, index: int) -> None:  # noqa: ANN001
    """Replace the board's datasets/digits with its share of the ``split``-board split."""
    from tasks.board.transport import connect

    conn = connect(board)
    try:
        folder = posixpath.join(board.root, "datasets", "digits")
        conn.run(["rm", "-rf", folder])
        conn.run(["mkdir", "-p", folder])
        conn.put(
            splits / f"boards-{split}" / f"board-{index}.npz", posixpath.join(folder, f"split{split}.npz")
        )
    finally:
        conn.close()


def make_splits(folder: Path, sizes: list[int], alpha: float) -> dict[int, dict]:
    """``folder/boards-N/board-I.npz`` for each N (recipes/datasets.py:fleet_split); per N the
    board sample counts (min, median, max) and the classes per board (min, max)."""
    sys.path.insert(0, str(PROJECT_ROOT / "recipes"))
    import numpy as np
    from datasets import fleet_pool, fleet_split

    pool, out = fleet_pool(), {}
    for n in sorted(set(sizes)):
        counts = fleet_split(folder / f"boards-{n}", n, alpha, pool=pool)
        classes = [len(np.unique(np.load(folder / f"boards-{n}" / f"board-{i}.npz")["y"])) for i in range(n)]
        out[n] = {"samples_min": min(counts), "samples_median": float(np.median(counts)),
                  "samples_max": max(counts), "classes_min": min(classes), "classes_max": max(classes)}  # fmt: skip
    return out


TICK = os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """The live processes under ``pid`` (the Prefect server and its workers); boards' processes
    are not among them (their sshd daemonises)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(k) for t in os.listdir(f"/proc/{p}/task") for k in
                    Path(f"/proc/{p}/task/{t}/children").read_text().split()]  # fmt: skip
        except OSError:
            continue
        out += kids
        todo += kids
    return out


def host_cpu_s() -> tuple[float, float]:
    """CPU seconds (this process's threads and reaped children, its live descendants' — the
    Prefect server's)."""
    t = os.times()
    own, kids = t.user + t.system + t.children_user + t.children_system, 0.0
    for pid in descendants(os.getpid()):
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids += sum(int(v) for v in f[11:15]) / TICK  # utime stime cutime cstime
    return own, kids


def peak_mb(pid: int, reset: bool = False) -> float:
    """VmHWM of ``pid`` in MB (0 if gone); ``reset`` starts a new peak (clear_refs 5)."""
    try:
        if reset:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def host_peaks(reset: bool = False) -> tuple[float, float]:
    """(this process's peak RSS, the sum of its descendants' peaks), MB."""
    return peak_mb(os.getpid(), reset), sum(peak_mb(p, reset) for p in descendants(os.getpid()))


def fleet_run(group: str, rounds: int, epochs: int) -> dict:
    from flows.fleet import FleetParams, odl_fleet

    params = FleetParams(group=group, rounds=rounds, epochs=epochs, overrides={"promotion.rollout": False})
    state = odl_fleet(params, return_state=True)
    if not state.is_completed():
        raise SystemExit(f"fleet run on {group} failed: {state.message}")
    return state.result().summary


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(f"signal {signum}")  # a SIGTERM still purges the boards (the finally below)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,2,4,8", help="fleet sizes N, any positive integers")
    ap.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration of the label split")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--split", type=int, default=4, help="the split whose local models are trained (0: none)")
    ap.add_argument("--cpu-quota", type=float, default=0.25)
    ap.add_argument("--quick", action="store_true", help="N = 1, 2; one round; split 2")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sizes = [1, 2] if args.quick else [int(s) for s in args.sizes.split(",")]
    rounds, split = (1, 2) if args.quick else (args.rounds, args.split)
    if min(sizes) < 1 or split < 0:
        raise SystemExit("--sizes takes positive integers, --split 0 or more")
    signal.signal(signal.SIGTERM, _stop)

    from prefect.testing.utilities import prefect_test_harness

    from tasks import stages
    from tasks.board.inventory import save_group
    from tasks.recipe.load import load_recipe
    from tasks.vboard.lifecycle import board_down, board_up

    stages.prepare_data(load_recipe(RECIPE))
    home = Path(tempfile.mkdtemp(prefix="odl-bench-fleet-"))
    splits = home / "splits"
    shares = make_splits(splits, sizes + ([split, 1] if split else []), args.alpha)
    names = [f"fb{i}" for i in range(max(sizes + [split]))]
    rows, acc = [], {}
    try:
        with odl_home(home), prefect_test_harness(server_startup_timeout=120):
            try:
                t0 = time.monotonic()
                boards = []
                for n in names:
                    boards.append(board_up(n, venv=BOARD_VENV, cpu_quota=args.cpu_quota))
                print(f"{len(boards)} boards up in {time.monotonic() - t0:.1f} s", flush=True)
                # a warm-up run (not counted): the flow's first run prepares the model and imports
                give_data(boards[0], splits, sizes[0], 0)
                save_group("warm", names[:1])
                fleet_run("warm", 1, 1)
                for n in sizes:
                    for i in range(n):
                        give_data(boards[i], splits, n, i)
                    save_group(f"n{n}", names[:n])
                    host_peaks(reset=True)
                    (flow0, server0), t0 = host_cpu_s(), time.monotonic()
                    summary = fleet_run(f"n{n}", rounds, args.epochs)
                    (flow1, server1), run_s = host_cpu_s(), time.monotonic() - t0
                    cpu = flow1 - flow0 + server1 - server0
                    flow_mb, server_mb = host_peaks()
                    recs = summary["rounds"]
                    walls = [r["wall_s"] for r in recs]
                    oks = [[b for b in r["boards"].values() if b["status"] == "ok"] for r in recs]
                    slowest = [max(b["train_s"] for b in ok) for ok in oks]
                    rows.append({
                        "boards": n,
                        **shares[n],
                        "round_s": sum(walls) / len(walls),
                        "slowest_board_s": sum(slowest) / len(slowest),
                        "board_part_s": sum(b["seconds"] for ok in oks for b in ok) / sum(map(len, oks)),
                        "host_overhead_per_board_s": sum(w - s for w, s in zip(walls, slowest, strict=True)) / len(walls) / n,
                        "host_eval_s": sum(r["host_seconds"] for r in recs) / len(recs),
                        "host_cpu_per_round_s": cpu / len(recs),
                        "host_cpu_per_round_board_s": cpu / len(recs) / n,
                        "server_cpu_per_round_s": (server1 - server0) / len(recs),
                        "flow_peak_mb": flow_mb,
                        "server_peak_mb": server_mb,
                        "host_peak_mb_per_board": (flow_mb + server_mb) / n,
                        # the peak's growth per board over the first size's: what one more board costs
                        "host_peak_mb_per_added_board": (
                            (flow_mb + server_mb - rows[0]["flow_peak_mb"] - rows[0]["server_peak_mb"])
                            / (n - rows[0]["boards"])
                            if rows and n != rows[0]["boards"]
                            else float("nan")
                        ),
                        "bytes_up_per_round": sum(r["bytes_up"] for r in recs) / len(recs),
                        "bytes_down_per_round": sum(r["bytes_down"] for r in recs[1:] or recs) / max(1, len(recs[1:] or recs)),
                        "bytes_per_round": sum(r["bytes_up"] + r["bytes_down"] for r in recs) / len(recs),
                        "tensor_bytes": recs[0]["tensor_bytes"],
                        "boards_ok": min(map(len, oks)),
                        "federated_accuracy": recs[-1]["aggregate"]["accuracy"],
                        "run_s": run_s,
                    })  # fmt: skip
                    print(table(rows[-1:], [(k, k) for k in rows[-1]]), flush=True)
                if split:  # local models of the chosen split, and centralised training, same epoch budget
                    total = rounds * args.epochs
                    for i in range(split):
                        give_data(boards[i], splits, split, i)
                        save_group(f"local{i}", [names[i]])
                        acc[f"local {names[i]}"] = fleet_run(f"local{i}", 1, total)["rounds"][0]["aggregate"][
                            "accuracy"
                        ]
                    give_data(boards[0], splits, 1, 0)
                    save_group("central", [names[0]])
                    acc["centralised"] = fleet_run("central", 1, total)["rounds"][0]["aggregate"]["accuracy"]
                    acc["federated"] = next(
                        (r["federated_accuracy"] for r in rows if r["boards"] == split), float("nan")
                    )
            finally:  # every name, up or not: board_down of a board never brought up is a no-op
                for n in names:
                    board_down(n, purge=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print()
    print(table(rows, [("boards", "N"), ("samples_min", "min samples"), ("round_s", "s/round"),
                       ("slowest_board_s", "slowest board s"), ("board_part_s", "board part s"),
                       ("host_overhead_per_board_s", "host s/board"), ("host_eval_s", "host eval s"),
                       ("host_cpu_per_round_board_s", "host CPU s/round/board"),
                       ("flow_peak_mb", "flow MB"), ("server_peak_mb", "server MB"),
                       ("host_peak_mb_per_board", "MB/board"), ("host_peak_mb_per_added_board", "MB/added board"),
                       ("bytes_per_round", "B/round"),
                       ("federated_accuracy", "fed acc")]))  # fmt: skip
    figures = {"rows": rows, "accuracy": acc, "rounds": rounds, "epochs": args.epochs, "split": split,
               "alpha": args.alpha, "cpu_quota": args.cpu_quota}  # fmt: skip
    if split:
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
        figures["federated_beats_every_local"] = beats
    print(f"figures: {write_results('fleet', figures, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
