"""What ``bench/hosts.py --store`` measures beyond its table (issue 45): the hosts share a store
(tasks/store/) on a PostgreSQL cluster of its own, and per round are measured

* the bytes to and from the store, all hosts together (the first included): IP bytes counted by
  nftables on this machine, packets arriving for the store's port and leaving from it;
* the first host's CPU apart: the fleet flow (this process), the Prefect server, its PostgreSQL;
  the server's and the database's idle rates (the workers' polling, the server's own loops,
  measured over 11 s without a run) apart from what the round's boards cost;
* the Prefect database's load: its transactions (every API request is at least one) and the rows
  it wrote (inserted, updated, deleted), read from PostgreSQL's statistics once they settled, the
  workers' idle polling over the settling time subtracted.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SETTLE_S = 11.0  # an idle PostgreSQL backend reports its statistics within 10 s
TABLE = "odl_bench_store"


@contextlib.contextmanager
def store_lab(home: Path, port: int) -> Iterator[None]:
    """A shared store on its own cluster in ``home`` (listening beyond loopback, the hosts' network
    let in), set in this process's environment, which ``odl hosts up`` passes on; its port metered."""
    from tasks.stack import postgres
    from tasks.vboard.sshd import SUBNET

    saved = {k: os.environ.get(k) for k in ("ODL_STORE_URL", "ODL_STORE_PASSWORD_FILE")}
    try:
        postgres.start(home, port, listen="0.0.0.0")
        postgres.allow_network(home, f"{SUBNET}.0.0/16")
        password = postgres.create_store_database(home, port)
        os.environ.update(ODL_STORE_URL=f"postgresql://odl@127.0.0.1:{port}/odl_store",
                          ODL_STORE_PASSWORD_FILE=str(password))  # fmt: skip
        rules = (f"table inet {TABLE} {{\nchain in {{ type filter hook input priority 0; tcp dport {port} counter; }}\n"
                 f"chain out {{ type filter hook output priority 0; tcp sport {port} counter; }}\n}}\n")  # fmt: skip
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True, check=False)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        postgres.remove(home)


def store_bytes() -> tuple[int, int]:
    """(bytes to the store, bytes from it) since :func:`store_lab` began, every host's."""
    listing = json.loads(subprocess.run(["nft", "-j", "list", "table", "inet", TABLE], capture_output=True,
                                        text=True, check=True).stdout)  # fmt: skip
    counted = {}
    for item in listing["nftables"]:
        rule = item.get("rule")
        if rule:
            counted[rule["chain"]] = next(e["counter"]["bytes"] for e in rule["expr"] if "counter" in e)
    return counted["in"], counted["out"]


def prefect_db(env: dict[str, str]) -> tuple[int, int]:
    """(transactions committed, rows written) of the Prefect database so far, as its statistics say."""
    import psycopg

    url = env["PREFECT_API_DATABASE_CONNECTION_URL"].replace("postgresql+asyncpg://", "postgresql://")
    with psycopg.connect(url) as conn:
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]
        rows = conn.execute(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
        ).fetchone()[0]
    return int(commits), int(rows)


def settled(env: dict[str, str], cpu: Callable[[], dict[str, float]]) -> dict[str, float]:
    """The Prefect database's counts once settled, and the idle rates over the settling time (of
    its commits and rows, of the first host's CPU as ``cpu`` reads it: server, postgres)."""
    before, c0 = prefect_db(env), cpu()
    time.sleep(SETTLE_S)
    after, c1 = prefect_db(env), cpu()
    rate = {f"idle_{k}_s": (c1[k] - c0[k]) / SETTLE_S for k in ("server", "postgres")}
    return rate | {"commits": after[0], "rows": after[1], "idle_commits_s": (after[0] - before[0]) / SETTLE_S,
                   "idle_rows_s": (after[1] - before[1]) / SETTLE_S}  # fmt: skip


def figures(
    d0: dict[str, Any], d1: dict[str, Any], rounds: int, boards: int, wall_s: float
) -> dict[str, float]:
    """Per round (bytes) and per board and round (CPU, database) from the readings around the run
    (``wall_s`` long); the idle rates (the workers' polling, the server's loops) apart: the
    database's over the settling time counted in, the CPU's over the run."""
    per = rounds * boards

    def idle(key: str) -> float:
        return (d0[f"idle_{key}_s"] + d1[f"idle_{key}_s"]) / 2

    return {
        "store_bytes_to_per_round": (d1["store"][0] - d0["store"][0]) / rounds,
        "store_bytes_from_per_round": (d1["store"][1] - d0["store"][1]) / rounds,
        "flow_cpu_per_board_s": (d1["cpu"]["flow"] - d0["cpu"]["flow"]) / per,
        "server_cpu_per_board_s": (d1["cpu"]["server"] - d0["cpu"]["server"] - idle("server") * wall_s) / per,
        "postgres_cpu_per_board_s": (
            d1["cpu"]["postgres"] - d0["cpu"]["postgres"] - idle("postgres") * wall_s
        )
        / per,
        "prefect_commits_per_board": (d1["commits"] - d0["commits"] - idle("commits") * SETTLE_S) / per,
        "prefect_rows_per_board": (d1["rows"] - d0["rows"] - idle("rows") * SETTLE_S) / per,
        "idle_server_cpu_s": idle("server"),
        "idle_postgres_cpu_s": idle("postgres"),
        "idle_prefect_commits_s": idle("commits"),
    }
