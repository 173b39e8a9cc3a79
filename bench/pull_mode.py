"""Pull mode against SSH: the same job on a virtual SSH board and on a NAT'd pull board, and what a
board's check-in costs the host.

For each recipe (digits, and recipes/mobilenet_v2.toml: a 9 MB job), ``odl run`` on each board after
the recipe is prepared (its preparation is not counted), each in a fresh project home so nothing
is on a board before: the run's wall seconds and the bytes on the board's link both ways (the
counters of the host's end of its veth: the SSH board's own, the pull board's router uplink, so
TLS and HTTP, or SSH, framing is counted). Then ``--checkins N`` check-ins of idle enrolled boards
against the endpoint process (signed, verified, a mailbox read and write each): the endpoint's CPU
seconds per check-in, from its ``/proc`` counters, and the check-ins it answered per second. Root.

    .venv/bin/python bench/pull_mode.py                          # digits + mobilenet_v2, 400 check-ins
    .venv/bin/python bench/pull_mode.py --recipes digits --checkins 100
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BOARD_VENV, odl_home, table, write_results  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

RECIPES = {"digits": "recipes/digits.toml", "mobilenet_v2": "recipes/mobilenet_v2.toml"}
ODL = str(Path(sys.executable).parent / "odl")


def link_bytes(veth: str) -> int:
    """Bytes the host's end of ``veth`` sent and received so far."""
    stats = Path(f"/sys/class/net/{veth}/statistics")
    return int((stats / "tx_bytes").read_text()) + int((stats / "rx_bytes").read_text())


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prepared(recipe: str) -> tuple:
    """The recipe's inputs and preparation (1 epoch), cached in the home after the first call."""
    from tasks import stages
    from tasks.recipe.load import load_recipe

    recipe_ = load_recipe(PROJECT_ROOT / recipe, {"training.epochs": 1})
    stages.prepare_data(recipe_)
    inp = stages.inputs(recipe_)
    return inp, stages.prepare(inp)


def one_job(board: object, veth: str, recipe: str, job: str) -> dict:
    """The job of ``recipe`` (prepared before: its preparation is not counted) deployed to ``board``,
    trained there and its inference model retrieved: seconds and bytes on the board's link."""
    from tasks import stages

    inp, prep = prepared(recipe)
    spec, files = stages.job_spec(inp, prep, job)
    before, t0 = link_bytes(veth), time.perf_counter()
    deployed = stages.deploy(board, spec, files)
    training = stages.train(board, spec, files)
    with tempfile.TemporaryDirectory() as out:
        stages.retrieve(board, training, Path(out), only=("inference",))
    seconds = time.perf_counter() - t0
    blobs = sum(Path(f).stat().st_size for f in files.values())
    return {"seconds": round(seconds, 2), "link_mb": round((link_bytes(veth) - before) / 1e6, 3),
            "job_mb": round(blobs / 1e6, 3), "sent_mb": round(deployed.bytes_sent / 1e6, 3),
            "files": len(files), "uploaded": len(deployed.uploaded)}  # fmt: skip


def checkins(home: Path, n: int) -> dict:
    """``n`` check-ins of 8 enrolled idle boards against the running endpoint of ``home``."""
    from tasks.board.pull.mailbox import Mailbox
    from tasks.stack.endpoint import endpoint_config, tls_paths
    from tasks.stack.processes import running_pid
    from tests.board.pull_kit import Endpoint, Signer

    cfg = endpoint_config(home / "pull")
    mailbox = Mailbox(home / "pull")
    ep = Endpoint(cfg.url, tls_paths(home / "pull")[0], cfg.pin, mailbox)
    boards = [Signer(f"bench{i}", ep) for i in range(8)]
    for b in boards:
        assert b.enrol(mailbox.invite(b.name)).status_code == 200
    pid = running_pid(home, "endpoint")
    c0, t0 = cpu_s(pid), time.perf_counter()
    for i in range(n):
        assert boards[i % len(boards)].request("POST", "poll", {"info": {}, "jobs": {}}).status_code == 200
    wall, cpu = time.perf_counter() - t0, cpu_s(pid) - c0
    return {"checkins": n, "endpoint_cpu_ms_per_checkin": round(1000 * cpu / n, 3),
            "checkins_per_s_serial": round(n / wall, 1)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated of {', '.join(RECIPES)}")
    ap.add_argument("--checkins", type=int, default=400)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/pull_mode.py needs root (virtual boards: useradd, ip netns, nftables)")
    from flows.cli.pull import lab_endpoint
    from tasks.stack.endpoint import stop
    from tasks.vboard.lifecycle import board_down, board_status, board_up
    from tasks.vboard.natnet import remove_gateway

    rows, figures = [], {}
    for name in args.recipes.split(","):
        with tempfile.TemporaryDirectory(prefix="odl-pull-bench-") as tmp, odl_home(Path(tmp)) as home:
            try:
                ssh = board_up("bssh", venv=BOARD_VENV)
                pull = board_up("bpull", venv=BOARD_VENV, pull=lab_endpoint())
                prepared(RECIPES[name])  # the preparation, not counted
                for transport, board in (("ssh", ssh), ("pull", pull)):
                    veth = board_status(board.name)["veth_host"]
                    got = one_job(board, veth, RECIPES[name], f"{name}-{transport}")
                    rows.append({"recipe": name, "transport": transport, **got})
                if "checkin" not in figures:
                    figures["checkin"] = checkins(home, args.checkins)
            finally:
                for b in ("bssh", "bpull"):
                    board_down(b, purge=True)
                stop(home)
                remove_gateway()
    figures["jobs"] = rows
    print(table(rows, [("recipe", "recipe"), ("transport", "transport"), ("seconds", "run s"),
                       ("job_mb", "job files MB"), ("sent_mb", "sent MB"), ("uploaded", "files sent"),
                       ("link_mb", "MB on the link")]))  # fmt: skip
    if "checkin" in figures:
        print(f"check-ins: {figures['checkin']}")
    print(f"results: {write_results('pull_mode', figures)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
