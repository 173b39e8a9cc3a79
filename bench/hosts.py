"""Hosts benchmark (issue 45): one fleet round set fanned out over 1, 2, 3 ... simulated worker hosts.

A fresh first home runs the Prefect server on its private PostgreSQL, listening beyond loopback so
the hosts' namespaces reach it (no worker of its own); N virtual boards (a CPU quota each,
``--board-quota``) hold a non-IID split of the fleet's digits (bench/fleet.py's). Per host count H
it brings up H hosts (``odl hosts up``: own netns, own ODL_HOME, one worker, ``--cpu-quota`` CPUs
each), runs a warm-up round (each new host prepares the recipe in its own home: not counted), then
the fleet flow with ``fanout`` H (H group runs a round) and measures:

* round wall time (fan-out to aggregate, the flow's own ``wall_s``);
* host CPU per board and round: the hosts' workers and the flow runs they ran (/proc), and the
  first host's (this process's flow, the Prefect server, PostgreSQL) apart;
* bytes moved per round: over the hosts' links (their veths: SSH to the boards and the server's
  API) and through the server (the weights in each group run's parameters, the updates back).

    nice -n 19 .venv/bin/python bench/hosts.py --hosts 1,2,3 --boards 64 --cpu-quota 0.5
    .venv/bin/python bench/hosts.py --quick           # 2 hosts, 2 boards, 1 round, no warm-up (~1 min)
    nice -n 19 .venv/bin/python bench/hosts.py --hosts 1,2 --boards 16 --rounds 1 --store   # + the store's load
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, odl_home, table, write_results  # noqa: E402
from bench.fleet import RECIPE, descendants, give_data, host_cpu_s, make_splits  # noqa: E402

GROUP = "fleet"


def _ports(n: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@contextlib.contextmanager
def fleet_lab(home: Path, boards: int, board_quota: float | None, alpha: float = 0.5) -> Iterator[dict]:
    """The first home ``home``: its stack on PostgreSQL (server on 0.0.0.0, no worker), ``boards``
    virtual boards with their data, group ``fleet``; yields the stack's environment. At the end
    the hosts, the boards (purged), the stack and its cluster are gone."""
    from tasks import stages
    from tasks.board.inventory import save_group
    from tasks.hosts import lifecycle
    from tasks.recipe.load import load_recipe
    from tasks.stack import postgres, server
    from tasks.vboard.lifecycle import board_down, board_up

    names = [f"hb{i}" for i in range(boards)]
    with odl_home(home):
        port, pg_port = _ports(2)
        env = server.stack_env(port=port, home=home, db="postgres", pg_port=pg_port, host="0.0.0.0")
        try:
            server.up(env, workers=0)
            stages.prepare_data(load_recipe(RECIPE))
            make_splits(home / "splits", [boards], alpha)
            for i, name in enumerate(names):
                give_data(board_up(name, venv=BOARD_VENV, cpu_quota=board_quota), home / "splits", boards, i)
            save_group(GROUP, names)
            yield env
        finally:
            lifecycle.down()
            for name in names:
                board_down(name, purge=True)
            server.down(home)
            postgres.remove(home)


def run_fleet(
    env: dict[str, str], rounds: int, epochs: int, fanout: int | None, deadline_s: int | None = None
) -> dict[str, Any]:
    """The fleet flow in this process against the lab's server; its summary (rounds.json)."""
    from prefect.settings import temporary_settings

    from flows.fleet import FleetParams, odl_fleet
    from tasks.prefect import boards
    from tasks.stack.server import api_settings

    params = FleetParams(
        group=GROUP, rounds=rounds, epochs=epochs, fanout=fanout, deadline_s=deadline_s,
        overrides={"promotion.rollout": False},
    )  # fmt: skip
    with temporary_settings(updates=api_settings(env)):
        try:
            state = odl_fleet(params, return_state=True)
        finally:  # sent while the lab's server is up: a caller stops it next
            boards.flush()
        if not state.is_completed():
            raise SystemExit(f"fleet run with fanout {fanout} failed: {state.message}")
        return state.result().summary


def first_host_cpu(home: Path) -> dict[str, float]:
    """CPU seconds of this process (the fleet flow), the Prefect server it started and the
    PostgreSQL cluster (``postgres``), and their sum (``all``)."""
    from tasks.stack import postgres

    own, kids = host_cpu_s()
    pg, cpu = postgres.status(home)["pid"], 0.0
    for pid in [pg, *descendants(pg)] if pg else []:
        with contextlib.suppress(OSError):
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += sum(int(v) for v in f[11:15]) / os.sysconf("SC_CLK_TCK")
    return {"flow": own, "server": kids, "postgres": cpu, "all": own + kids + cpu}


def hosts_now() -> tuple[float, int]:
    """The hosts' workers' CPU seconds (with their finished flow runs) and bytes over their links."""
    from tasks.hosts import lifecycle

    found = lifecycle.status()
    return sum(h["cpu_s"] or 0.0 for h in found), sum(h["bytes"] or 0 for h in found)


def measure(
    env: dict[str, str], hosts: int, boards: int, rounds: int, epochs: int, quota: float | None,
    store: bool = False, warm_up: bool = True,
) -> tuple[dict, dict[str, Any]]:  # fmt: skip
    """Bring up ``hosts`` hosts (kept when they run as asked), warm them up (unless not ``warm_up``:
    then the measured run's figures include each host's preparation), run the measured fleet run;
    its row (with ``store``, bench/hosts_detail.py's figures too) and the run's summary."""
    from bench import hosts_detail as detail
    from tasks.hosts import lifecycle

    home = Path(env["ODL_HOME"])
    lifecycle.up(hosts, quota)
    if warm_up:  # each new host prepares the recipe (or fetches it from the store)
        run_fleet(env, 1, 1, hosts)
    d0 = detail.settled(env, lambda: first_host_cpu(home)) if store else {}
    (w0, b0), f0, t0 = hosts_now(), first_host_cpu(home), time.monotonic()
    d0 |= {"store": detail.store_bytes(), "cpu": f0} if store else {}
    summary = run_fleet(env, rounds, epochs, hosts)
    (w1, b1), f1, run_s = hosts_now(), first_host_cpu(home), time.monotonic() - t0
    d1 = {"store": detail.store_bytes(), "cpu": f1} if store else {}
    recs = summary["rounds"]
    groups = [g for r in recs for g in r["groups"]]
    n = len(recs)
    more = (
        detail.figures(d0, d1 | detail.settled(env, lambda: first_host_cpu(home)), n, boards, run_s)
        if store
        else {}
    )
    row = more | {
        "hosts": hosts,
        "boards": boards,
        "round_s": sum(r["wall_s"] for r in recs) / n,
        "hosts_cpu_per_board_s": (w1 - w0) / n / boards,
        "first_host_cpu_per_board_s": (f1["all"] - f0["all"]) / n / boards,
        "host_cpu_per_board_s": (w1 - w0 + f1["all"] - f0["all"]) / n / boards,
        "link_bytes_per_round": (b1 - b0) / n,
        "server_payload_bytes_per_round": sum(g["bytes_back"] + g["bytes_out"] for g in groups) / n,
        "board_bytes_per_round": sum(r["bytes_up"] + r["bytes_down"] for r in recs) / n,
        "hosts_used": len({g["host"] for g in groups}),
        "boards_ok": min(len(r["took_part"]) for r in recs),
        "accuracy": recs[-1]["aggregate"]["accuracy"],
        "run_s": run_s,
        "warm_up": warm_up,
    }
    return row, summary


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(f"signal {signum}")  # the lab is still torn down (its finally)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="1,2,3", help="host counts, e.g. 1,2,3")
    ap.add_argument("--boards", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--cpu-quota", type=float, default=None, help="CPUs per simulated host (cgroup)")
    ap.add_argument("--board-quota", type=float, default=0.05, help="CPUs per virtual board (cgroup)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="2 hosts, 2 boards of 0.25 CPU, 1 round, no warm-up round (a smoke run)",
    )
    ap.add_argument(
        "--store",
        action="store_true",
        help="the hosts share a store (its own PostgreSQL): also "
        "bytes to/from it, the first host's CPU apart, the Prefect database's load (bench/hosts_detail.py)",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    try:
        counts = [2] if args.quick else [int(h) for h in args.hosts.split(",")]
    except ValueError:
        raise SystemExit(f"--hosts {args.hosts}: host counts, e.g. 1,2,3") from None
    boards, rounds = (2, 1) if args.quick else (args.boards, args.rounds)
    board_quota = 0.25 if args.quick else args.board_quota
    if min(counts) < 1:
        raise SystemExit(f"--hosts {args.hosts}: at least one host per count")
    if boards < max(counts):
        raise SystemExit(f"--boards {boards}: at least one board per host ({max(counts)})")
    signal.signal(signal.SIGTERM, _stop)
    rows = []
    home = Path(tempfile.mkdtemp(prefix="odl-bench-hosts-")) / "odl"
    with contextlib.ExitStack() as stack:
        if args.store:
            from bench.hosts_detail import store_lab

            stack.enter_context(store_lab(home.parent / "store", _ports(1)[0]))
        env = stack.enter_context(fleet_lab(home, boards, board_quota))
        for h in counts:
            row, _ = measure(env, h, boards, rounds, args.epochs, args.cpu_quota, args.store, not args.quick)
            rows.append(row)
            print(table(rows[-1:], [(k, k) for k in rows[-1]]), flush=True)
    print()
    print(table(rows, [("hosts", "hosts"), ("boards", "boards"), ("round_s", "s/round"),
                       ("hosts_cpu_per_board_s", "hosts CPU s/board"),
                       ("first_host_cpu_per_board_s", "first host CPU s/board"),
                       ("link_bytes_per_round", "link B/round"),
                       ("server_payload_bytes_per_round", "via server B/round"),
                       ("hosts_used", "hosts used"), ("accuracy", "acc")]))  # fmt: skip
    figures = {"rows": rows, "rounds": rounds, "epochs": args.epochs, "cpu_quota": args.cpu_quota,
               "board_quota": board_quota}  # fmt: skip
    print(f"figures: {write_results('hosts', figures, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
