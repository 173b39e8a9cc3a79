"""A federated round over N real board agents in pull mode, and what each board costs the host.

For each N of ``--boards``: a fresh project home with its own Prefect server (SQLite) and pull
endpoint, N boards enrolled (each a folder with its own key and its own label-skewed share of the
fleet's shifted digits: ``--samples`` drawn with a Dirichlet ``--alpha`` skew), then one FedAvg
round of ``recipes/digits_fleet.toml`` (one local epoch) by the fleet flow itself (flows/fleet.py,
in this process, against the server). The boards' services run as a process of their own
(bench/_fleet_boards.py), ``--wave`` at a time: a board checks in, takes its job, trains, sends
its update and goes; the next comes. The recipe is prepared before the round (a nightly round
finds its preparation cached), so the round's costs are the round's.

Per N it prints, over the round only:
* wall seconds; host CPU seconds per board, apart: the flow's process (this one: the fleet flow,
  aggregation and host evaluation), the Prefect server's (its process tree), the endpoint's;
* Prefect API requests per board (the server's access log: every HTTP request) and events per
  board (its events table: task runs' states and the like arrive as events over one websocket);
* bytes per board through the Prefect server's port and through the endpoint's (nftables
  counters on loopback, both ways);
* the peak memory (VmHWM) of the aggregating process;
* whether the aggregate equals the boards' updates averaged offline (numpy, float64,
  sample-weighted, from the update files the round kept), to the bit.

With ``--vanish``, ``--poison`` and ``--malformed`` (fractions of N, rounded up) some boards are
killed once they took their job, send a scaled update (x -10, a tampered agent) or NaN tensors; the
round then uses a trimmed mean (``--trim``), closes on its quorum (90 %) at ``--deadline``, and the
check is that every coordinate of its aggregate lies within the honest boards' range; it prints
the boards left out and why, and the outliers. ``--quick`` is such a round of 20 boards.

Then the slopes: each cost's growth per added board from the first N to the second and from the
second to the third (linear when they agree within 1.2x). Root (nftables).

    .venv/bin/python bench/fleet_scale.py --boards 64,256,1000   # ~40 min
    .venv/bin/python bench/fleet_scale.py --quick                # 20 boards with faults (~1.5 min)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, table, write_results  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

RECIPE = PROJECT_ROOT / "recipes" / "digits_fleet.toml"
TICK = os.sysconf("SC_CLK_TCK")
NFT_TABLE = "odl_fleet_scale"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants (their reaped children too)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            kids = [int(k) for t in os.listdir(f"/proc/{p}/task")
                    for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]  # fmt: skip
        except OSError:
            continue
        total += sum(int(v) for v in f[11:15]) / TICK
        todo += kids
    return total


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system  # this process's threads only: the boards are another process's children


def peak_mb(reset: bool = False) -> float:
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def nft_counters(ports: dict[str, int]) -> None:
    """Count the bytes to and from each port on loopback (output hook: every packet once)."""
    rules = [
        f"add table inet {NFT_TABLE}",
        f"add chain inet {NFT_TABLE} out {{ type filter hook output priority 0; }}",
    ]
    for name, port in ports.items():
        rules.append(f"add counter inet {NFT_TABLE} {name}")
        rules.append(f"add rule inet {NFT_TABLE} out tcp dport {port} counter name {name}")
        rules.append(f"add rule inet {NFT_TABLE} out tcp sport {port} counter name {name}")
    subprocess.run(["nft", "-f", "-"], input="\n".join(rules), text=True, check=True)


def nft_bytes(name: str) -> int:
    out = subprocess.run(["nft", "-j", "list", "counter", "inet", NFT_TABLE, name], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return int(next(i["counter"]["bytes"] for i in json.loads(out)["nftables"] if "counter" in i))


def nft_drop() -> None:
    subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE], capture_output=True, check=False)


REQUEST = re.compile(r'"(GET|POST|PUT|PATCH|DELETE) /api/')


def api_requests(log: Path) -> int:
    """HTTP requests the Prefect server's access log holds so far."""
    if not log.exists():
        return 0
    with log.open(errors="replace") as f:
        return sum(1 for line in f if REQUEST.search(line))


def prefect_events(home: Path) -> int:
    import sqlite3

    db = sqlite3.connect(home / "prefect" / "prefect.db", timeout=30)
    try:
        return int(db.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        db.close()


def enrol_boards(home: Path, n: int, samples: int, alpha: float, url: str, pin: str) -> list[dict]:
    """N board folders, each with its agent key, its enrolment (a one-time code) and its data; the
    inventory's pull entries and group ``scale``."""
    sys.path.insert(0, str(PROJECT_ROOT / "recipes"))
    from datasets import fleet_pool

    from bench._fleet_boards import board_data
    from device_agent.pull.client import Client
    from device_agent.pull.config import PullConfig
    from device_agent.pull.identity import Identity
    from device_agent.pull.service import enrol
    from tasks.board.inventory import Board
    from tasks.board.pull.mailbox import Mailbox

    pool_x, pool_y = fleet_pool()[:2]
    mailbox = Mailbox()
    py = str(BOARD_VENV / "bin" / "python")
    boards = [{"name": f"b{i:04d}", "root": str(home / "boards" / f"b{i:04d}" / "odl")} for i in range(n)]

    def one(i_b: tuple[int, dict]) -> None:
        i, b = i_b
        root = Path(b["root"])
        root.mkdir(parents=True, exist_ok=True)
        board_data(root, i, pool_x, pool_y, samples, alpha)
        ident = Identity(root)
        ident.ensure()
        client = Client(root, PullConfig(url, pin, b["name"]), identity=ident)
        try:
            enrol(client, root, mailbox.invite(b["name"]))
        finally:
            client.close()

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(one, enumerate(boards)))
    entries = [Board(b["name"], b["root"], transport="pull", python=py, ort_version="1.19.2") for b in boards]
    write_inventory(home, entries)
    return boards


def write_inventory(home: Path, entries: list) -> None:
    lines = [b.to_toml() for b in entries]
    names = ", ".join(f'"{b.name}"' for b in entries)
    lines += ["[groups]", f"scale = [{names}]", ""]
    (home / "inventory.toml").write_text("\n".join(lines))


def offline_mean(folder: Path, took_part: list[str], samples: dict[str, int]) -> dict:
    """The sample-weighted mean of the boards' kept updates, float64, written out here on its own."""
    import numpy as np

    acc: dict = {}
    total = sum(samples[b] for b in took_part)
    for b in took_part:
        with np.load(folder / b / "trainable.npz") as z:
            for k in z.files:
                acc.setdefault(k, np.zeros(z[k].shape, np.float64))
                acc[k] += z[k].astype(np.float64) * (samples[b] / total)
    return acc


TAMPER = PROJECT_ROOT / "tests" / "fleet" / "tamper"  # a board agent that scales its update (tests only)


def assign_faults(boards: list[dict], args: argparse.Namespace) -> dict:
    """Which boards vanish mid-round, send a poisoned update (scaled x -10, as a tampered agent) or
    a malformed one (NaN): ``ceil(fraction x N)`` each, spread evenly over the fleet, none twice."""
    import math

    n = len(boards)
    counts = {k: math.ceil(getattr(args, k) * n) for k in ("vanish", "poison", "malformed")}
    spots = [round(i * n / max(1, sum(counts.values()))) for i in range(sum(counts.values()))]
    names = [boards[min(n - 1, i)]["name"] for i in spots]
    out: dict = {"vanish": [], "poison": [], "malformed": []}
    for kind in ("vanish", "poison", "malformed"):
        out[kind], names = names[: counts[kind]], names[counts[kind] :]
    for b in boards:
        scale = "-10" if b["name"] in out["poison"] else "nan" if b["name"] in out["malformed"] else None
        if scale is not None:
            b["env"] = {"PYTHONPATH": str(TAMPER), "ODL_TEST_TAMPER_SCALE": scale}
    out["any"] = any(out[k] for k in ("vanish", "poison", "malformed"))
    return out


def within_honest(aggregate: dict, folder: Path, honest: list[str]) -> bool:
    """Whether every coordinate of the aggregate lies within the honest boards' range of it (the
    trimmed mean's bound while the poisoned boards are no more than it trims on each side)."""
    import numpy as np

    lo: dict = {}
    hi: dict = {}
    for b in honest:
        with np.load(folder / b / "trainable.npz") as z:
            for k in z.files:
                lo[k] = np.minimum(lo[k], z[k]) if k in lo else z[k]
                hi[k] = np.maximum(hi[k], z[k]) if k in hi else z[k]
    return all(bool(((aggregate[k] >= lo[k]) & (aggregate[k] <= hi[k])).all()) for k in aggregate)


def one_size(n: int, args: argparse.Namespace) -> dict:
    """One fleet of ``n`` boards, one round (run in a child process: its own ODL_HOME and Prefect)."""
    home = Path(tempfile.mkdtemp(prefix=f"odl-scale-{n}-"))
    from tasks.stack.server import stack_env

    port, eport = free_port(), free_port()
    env = stack_env(port, home)
    env.update(PREFECT_SERVER_LOGGING_LEVEL="INFO", ODL_BOARD_LEASE_S="600")  # INFO: uvicorn's access log
    plan = Path(home) / "plan.json"
    cmd = [sys.executable, __file__, "--child", str(n), "--home", str(home), "--port", str(port),
           "--endpoint-port", str(eport), "--wave", str(args.wave), "--samples", str(args.samples),
           "--alpha", str(args.alpha), "--out", str(plan), "--deadline", str(args.deadline), "--vanish",
           str(args.vanish), "--poison", str(args.poison), "--malformed", str(args.malformed), "--trim",
           str(args.trim)] + ["--profile"] * args.profile  # fmt: skip
    try:
        subprocess.run(cmd, env=env, check=True, timeout=args.timeout)
        return json.loads(plan.read_text())
    finally:
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)


def child(args: argparse.Namespace) -> None:
    """The measured side: servers, boards, the round (see the module's docstring)."""
    import torch  # noqa: F401 - first: the agent's code enrolling the boards blocks a later import of it

    from tasks.stack import endpoint
    from tasks.stack.processes import stop_service
    from tasks.stack.server import start_server

    home, n = Path(args.home), args.child
    env = dict(os.environ)
    nft_drop()
    t0 = time.monotonic()
    server_pid = start_server(env)
    cfg = endpoint.start(f"127.0.0.1:{args.endpoint_port}", None, home)
    print(f"[{n} boards] Prefect server and endpoint up in {time.monotonic() - t0:.1f} s", flush=True)
    endpoint_pid = int((home / "run" / "endpoint.pid").read_text())
    launcher = None
    try:
        t = time.monotonic()
        boards = enrol_boards(home, n, args.samples, args.alpha, cfg.url, cfg.pin)
        enrol_s = time.monotonic() - t
        print(f"[{n} boards] enrolled in {enrol_s:.1f} s", flush=True)
        agent = home / "agent"
        shutil.copytree(PROJECT_ROOT / "device_agent", agent / "device_agent",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        from tasks import stages
        from tasks.recipe.load import load_recipe

        recipe = load_recipe(RECIPE, {"training.epochs": 1})
        stages.prepare_data(recipe)
        stages.prepare(stages.inputs(recipe))  # cached, as a nightly round finds it
        print(f"[{n} boards] recipe prepared at {time.monotonic() - t0:.1f} s", flush=True)

        faults = assign_faults(boards, args)
        wplan = {"boards": boards, "wave": args.wave, "python": str(BOARD_VENV / "bin" / "python"),
                 "agent": str(agent), "mailbox": str(home / "pull" / "mailbox.sqlite3"), "life_s": 600,
                 "vanish": faults["vanish"], "out": str(home / "waves.json")}  # fmt: skip
        (home / "waves-plan.json").write_text(json.dumps(wplan))
        nft_counters({"prefect": args.port, "endpoint": args.endpoint_port})
        from flows.fleet import FleetParams, odl_fleet

        robust = {"fleet.strategy": "trimmed_mean", "fleet.trim_fraction": args.trim} if faults["any"] else {}
        params = FleetParams(recipe=str(RECIPE), group="scale", rounds=1, epochs=1, min_boards=max(1, n * 9 // 10),
                             deadline_s=args.deadline, overrides={"promotion.rollout": False, **robust})  # fmt: skip
        log = home / "logs" / "prefect-server.log"
        before = {"own": own_cpu_s(), "server": tree_cpu_s(server_pid), "endpoint": tree_cpu_s(endpoint_pid),
                  "requests": api_requests(log), "events": prefect_events(home),
                  "prefect_b": nft_bytes("prefect"), "endpoint_b": nft_bytes("endpoint")}  # fmt: skip
        peak_mb(reset=True)
        start = time.monotonic()
        launcher = subprocess.Popen([sys.executable, str(Path(__file__).parent / "_fleet_boards.py"),
                                     str(home / "waves-plan.json")])  # fmt: skip
        if args.profile:
            from bench._sampler import Sampler

            with Sampler(root=str(PROJECT_ROOT)) as sampler:
                state = odl_fleet(params, return_state=True)
            (home / "profile.txt").write_text(sampler.report())
            print(sampler.report())
        else:
            state = odl_fleet(params, return_state=True)
        wall = time.monotonic() - start
        print(f"[{n} boards] the flow ended in {wall:.1f} s", flush=True)
        after = {"own": own_cpu_s(), "server": tree_cpu_s(server_pid), "endpoint": tree_cpu_s(endpoint_pid),
                 "requests": api_requests(log), "events": prefect_events(home),
                 "prefect_b": nft_bytes("prefect"), "endpoint_b": nft_bytes("endpoint")}  # fmt: skip
        peak = peak_mb()
        launcher.send_signal(signal.SIGTERM)  # the round is closed: boards still up are not needed
        launcher.wait(timeout=120)
        waves_out = json.loads((home / "waves.json").read_text())
        if not state.is_completed():
            raise SystemExit(f"the fleet round on {n} boards failed: {state.message}")
        summary = state.result().summary
        rec = summary["rounds"][-1]
        folder = Path(summary_folder(summary))
        samples = {b: row["samples"] for b, row in rec["boards"].items() if row["status"] == "ok"}
        from tasks.checkpoint import checkpoint_weights

        got = checkpoint_weights(folder / "round-001" / "aggregate.ckpt", trainable_only=True)
        if faults["any"]:
            honest = [b for b in rec["took_part"] if b not in faults["poison"]]
            same = within_honest(got, folder / "round-001", honest)
        else:
            expect = offline_mean(folder / "round-001", rec["took_part"], samples)
            same = sorted(got) == sorted(expect) and all(
                (got[k] == expect[k].astype(got[k].dtype)).all() for k in got
            )
        d = {k: after[k] - before[k] for k in after}
        row = {"boards": n, "took_part": len(rec["took_part"]), "wall_s": round(wall, 1),
               "enrol_s": round(enrol_s, 1), "flow_cpu": d["own"] / n, "server_cpu": d["server"] / n,
               "endpoint_cpu": d["endpoint"] / n, "host_cpu": (d["own"] + d["server"] + d["endpoint"]) / n,
               "requests": d["requests"] / n, "events": d["events"] / n,
               "prefect_kb": d["prefect_b"] / n / 1024, "endpoint_kb": d["endpoint_b"] / n / 1024,
               "peak_mb": round(peak, 1), "identical": same, "wave": args.wave,
               "services_at_once": waves_out["peak_services"], "faults": {k: v for k, v in faults.items() if k != "any"},
               "left_out": {b: f"{row['status']}: {row.get('error', '')}"[:300] for b, row in rec["boards"].items()
                            if row["status"] != "ok"},
               "outliers": rec.get("outliers", []), "min_boards": rec["min_boards"],
               "totals": d}  # fmt: skip
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(timeout=60)
        nft_drop()
        from tasks.prefect.boards import flush

        flush()  # the run's logs and events sent before its server stops (else the exit waits for it)
        endpoint.stop(home)
        stop_service(home, "prefect-server", 20)
        print(f"[{n} boards] stopped at {time.monotonic() - t0:.1f} s", flush=True)
    routes = endpoint_tally(home / "logs" / "endpoint.log")
    routes["enrol"] = routes.get("enrol", 0) - n  # each board's enrolment, before the round
    row["endpoint_requests"] = sum(routes.values()) / n
    row["endpoint_routes"] = {k: round(v / n, 2) for k, v in routes.items() if v}
    Path(args.out).write_text(json.dumps(row))


TALLY = re.compile(r"served \d+ requests in \d+ s: (.*)$")


def endpoint_tally(log: Path) -> dict[str, int]:
    """The endpoint's requests by route over its life (its log's tallies, the last at its shutdown)."""
    out: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = TALLY.search(line)
        for part in m.group(1).split(", ") if m else []:
            route, count = part.rsplit(" ", 1)
            out[route] = out.get(route, 0) + int(count)
    return out


def summary_folder(summary: dict) -> str:
    from tasks.paths import state_dir

    tag = "".join(c for c in summary["run_id"] if c.isalnum())[:12]
    return str(state_dir("fleet", f"{summary['recipe']}-{summary['group']}-{tag}"))


def slopes(rows: list[dict], keys: list[str]) -> list[dict]:
    """Each cost's added total per added board between consecutive sizes, and their ratio."""
    out = []
    for key in keys:
        tot = [r[key] * r["boards"] for r in rows]
        s = [
            (tot[i + 1] - tot[i]) / (rows[i + 1]["boards"] - rows[i]["boards"]) for i in range(len(rows) - 1)
        ]
        ratio = s[-1] / s[0] if len(s) >= 2 and s[0] else float("nan")
        out.append({"cost": key, **{f"slope{i + 1}": v for i, v in enumerate(s)}, "ratio": ratio})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boards", default="64,256,1000", help="fleet sizes, comma-separated")
    ap.add_argument("--wave", type=int, default=24, help="board services running at once")
    ap.add_argument("--samples", type=int, default=12, help="samples on each board")
    ap.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration of each board's labels")
    ap.add_argument("--timeout", type=float, default=7200, help="seconds for one fleet size")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="20 boards, 6 at once, 5%% vanishing, 1%% poisoned, 1%% malformed (one each): the mechanics",
    )
    ap.add_argument(
        "--vanish", type=float, default=0.0, help="fraction of boards killed once they took their job"
    )
    ap.add_argument(
        "--poison", type=float, default=0.0, help="fraction of boards sending a scaled update (x -10)"
    )
    ap.add_argument("--malformed", type=float, default=0.0, help="fraction of boards sending NaN tensors")
    ap.add_argument(
        "--trim", type=float, default=0.1, help="trim_fraction of the trimmed mean a faulty round uses"
    )
    ap.add_argument("--deadline", type=float, default=3600, help="the round's deadline_s")
    ap.add_argument("--keep", action="store_true", help="keep each size's home (logs, rounds.json)")
    ap.add_argument(
        "--out", type=Path, default=None, help="results JSON (default bench/results/fleet_scale.json)"
    )
    ap.add_argument("--profile", action="store_true", help="sample the flow's threads (bench/_sampler.py)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--endpoint-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    if os.geteuid() != 0:
        raise SystemExit("fleet_scale needs root (nftables counters on loopback)")
    from tasks.vboard.venv import ensure_board_venv

    ensure_board_venv(BOARD_VENV)  # the boards' environment: numpy and ONNX Runtime, no torch
    sizes = [20] if args.quick else [int(s) for s in args.boards.split(",")]
    if args.quick:
        args.wave, args.vanish, args.poison, args.malformed, args.deadline = 8, 0.05, 0.01, 0.01, 40
    rows = [one_size(n, args) for n in sizes]
    cols = [("boards", "boards"), ("took_part", "updates"), ("wall_s", "wall s"), ("host_cpu", "host CPU s/board"),
            ("flow_cpu", "flow"), ("server_cpu", "Prefect server"), ("endpoint_cpu", "endpoint"),
            ("requests", "API req/board"), ("events", "events/board"), ("prefect_kb", "Prefect KB/board"),
            ("endpoint_requests", "endpoint req/board"),
            ("endpoint_kb", "endpoint KB/board"), ("peak_mb", "aggregator peak MB"), ("identical", "= offline")]  # fmt: skip
    print(table(rows, cols))
    for r in rows:
        for board, why in r["left_out"].items():
            print(f"{r['boards']} boards: left out {board}: {why}")
        if r["outliers"]:
            print(f"{r['boards']} boards: outliers {', '.join(r['outliers'])}")
    figures: dict = {"rows": rows}
    if len(rows) >= 3:
        sl = slopes(
            rows,
            ["host_cpu", "flow_cpu", "server_cpu", "endpoint_cpu", "requests", "prefect_kb", "endpoint_kb"],
        )
        print(table(sl, [("cost", "cost"), ("slope1", f"per board {sizes[0]}->{sizes[1]}"),
                         ("slope2", f"per board {sizes[1]}->{sizes[2]}"), ("ratio", "ratio")]))  # fmt: skip
        figures["slopes"] = sl
    print(f"figures: {write_results('fleet_scale' + ('_quick' if args.quick else ''), figures, args.out)}")
    bad = [r["boards"] for r in rows if not r["identical"]]
    if bad:
        print(
            f"the aggregate differs from the offline mean (with faults: leaves the honest range) at {bad} boards"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
