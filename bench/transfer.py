"""Transfer benchmark: the project's SSH transport beside ``scp`` on the same board.

Prints upload and download MB/s of a file (median of --repeat runs, interleaved with scp so machine
load hits both alike), their ratio (target >= 0.9), the round trip of a no-op remote command, and
the time of a deployment of the same file as a content-addressed blob: first upload vs an unchanged
re-deploy (connect + agent check + blob listing, 0 bytes sent), and within the first the agent's
install (one tarball, unpacked by the board's python). Figures go to
bench/results/transfer.json.

The temporary virtual board sits behind a shaped link, by default the slow field link of issue 15
(``--link "rate=10mbit,delay=50ms,loss=1%"``: 10 Mbit/s and 50 ms each way, 1% of packets lost);
``--link none`` measures the bare veth pair (then the file is 200 MB; over a rate, ~5 s of it).

    .venv/bin/python bench/transfer.py                 # brings up (and purges) a virtual board
    .venv/bin/python bench/transfer.py --link none     # the same without shaping
    .venv/bin/python bench/transfer.py --board mp2-lab # a board of the inventory (no shaping)
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tasks.board import agent, blobs  # noqa: E402
from tasks.board.inventory import Board, get_board  # noqa: E402
from tasks.board.transport import connect  # noqa: E402
from tasks.hashing import file_sha256  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "transfer.json"
DEFAULT_LINK = "rate=10mbit,delay=50ms,loss=1%"


def scp_argv(board: Board, src: str, dst: str) -> list[str]:
    """scp with the same key and pinned known_hosts as the project's transport."""
    return ["scp", "-q", "-i", str(board.key), "-P", str(board.port), "-o", f"UserKnownHostsFile={board.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", src, dst]  # fmt: skip


def timed(fn) -> float:  # noqa: ANN001
    """Seconds ``fn()`` took."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(board: Board, src: Path, repeat: int) -> dict[str, list[float]]:
    """Seconds per run of each way of moving ``src`` to the board and back."""
    remote_dir = os.path.dirname(board.root.rstrip("/"))
    r_ours, r_scp = f"{remote_dir}/bench-ours.bin", f"{remote_dir}/bench-scp.bin"
    back = src.with_suffix(".back")
    target = f"{board.user}@{board.host}"
    times: dict[str, list[float]] = {"ours_put": [], "ours_get": [], "scp_put": [], "scp_get": []}
    conn = connect(board)
    try:
        for _ in range(repeat):
            times["ours_put"].append(timed(lambda: conn.put(src, r_ours)))
            times["scp_put"].append(
                timed(lambda: subprocess.run(scp_argv(board, str(src), f"{target}:{r_scp}"), check=True))
            )
            times["ours_get"].append(timed(lambda: conn.get(r_ours, back)))
            times["scp_get"].append(
                timed(lambda: subprocess.run(scp_argv(board, f"{target}:{r_scp}", str(back)), check=True))
            )
        conn.run(["rm", "-f", r_ours, r_scp])
    finally:
        conn.close()
        back.unlink(missing_ok=True)
    return times


def round_trip_ms(board: Board, repeat: int = 5) -> float:
    """Milliseconds of the quickest no-op remote command (``true``) on one open connection."""
    conn = connect(board)
    try:
        return round(1000 * min(timed(lambda: conn.run(["true"])) for _ in range(repeat)), 1)
    finally:
        conn.close()


def redeploy(board: Board, src: Path) -> dict[str, float]:
    """First deployment of ``src`` as a blob vs an unchanged re-deploy (new connection each time)."""
    files = {file_sha256(src): src}

    def deploy() -> tuple[int, float]:
        conn = connect(board)
        try:
            start = time.perf_counter()
            agent.install_agent(conn, board)
            took = time.perf_counter() - start
            return blobs.upload_blobs(conn, board, files).bytes_sent, took
        finally:
            conn.close()

    conn = connect(board)
    try:  # a board without the agent: the first deploy installs it (one tarball)
        conn.run(["rm", "-rf", f"{board.root}/agent"])
    finally:
        conn.close()
    start = time.perf_counter()
    sent_first, install = deploy()
    first = time.perf_counter() - start
    start = time.perf_counter()
    sent_again, _ = deploy()
    again = time.perf_counter() - start
    conn = connect(board)
    try:
        conn.run(["rm", "-f", f"{board.root}/blobs/{next(iter(files))}"])
    finally:
        conn.close()
    return {"first_deploy_s": round(first, 3), "first_bytes": sent_first, "agent_install_s": round(install, 3),
            "unchanged_redeploy_s": round(again, 3), "unchanged_bytes": sent_again}  # fmt: skip


def main() -> int:
    """Run the benchmark, print the figures and write bench/results/transfer.json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--board", help="inventory board (default: a temporary virtual board)")
    ap.add_argument("--link", default=DEFAULT_LINK, metavar="SPEC",
                    help=f"the virtual board's link (default {DEFAULT_LINK.replace('%', '%%')!r}; 'none': unshaped)")  # fmt: skip
    ap.add_argument("--mb", type=int, help="file size (default: 200, or ~5 s of the link's rate)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    args.link = None if args.board or args.link.lower() in ("", "none") else args.link
    if args.mb is None:
        from tasks.vboard.link import parse_link

        rate = parse_link(args.link).rate_bps if args.link else None
        args.mb = max(1, round(rate / 8 * 5 / 2**20)) if rate else 200
    with tempfile.TemporaryDirectory(prefix="odl-bench-") as tmp:
        src = Path(tmp) / "payload.bin"
        with open(src, "wb") as f:
            for _ in range(args.mb):
                f.write(secrets.token_bytes(1 << 20))
        if args.board:
            figures = run(get_board(args.board), src, args)
        else:
            figures = run_on_virtual_board(Path(tmp), src, args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return 0


def run_on_virtual_board(tmp: Path, src: Path, args: argparse.Namespace) -> dict:
    """Bring up a throw-away virtual board in its own ODL_HOME, measure, purge it."""
    from tasks.vboard.lifecycle import board_down, board_up
    from tasks.vboard.venv import shared_board_venv

    os.environ["ODL_HOME"] = str(tmp / "home")
    name = f"bench{os.getpid() % 100000}"
    board = board_up(name, venv=shared_board_venv(), link=args.link)
    try:
        return run(board, src, args) | {"board": "virtual (netns sshd)", "link": args.link or "none"}
    finally:
        board_down(name, purge=True)


def run(board: Board, src: Path, args: argparse.Namespace) -> dict:
    """All figures for one board."""
    mb = src.stat().st_size / 1e6
    t = {k: statistics.median(v) for k, v in measure(board, src, args.repeat).items()}
    rate = {k: round(mb / v, 2) for k, v in t.items()}
    return {
        "file_mb": round(mb, 1), "repeat": args.repeat, "mb_per_s": rate,
        "mbit_per_s": {k: round(v * 8, 2) for k, v in rate.items()}, "round_trip_ms": round_trip_ms(board),
        "upload_ratio": round(rate["ours_put"] / rate["scp_put"], 3),
        "download_ratio": round(rate["ours_get"] / rate["scp_get"], 3),
        "target_ratio": 0.9, "load_avg_1m": round(os.getloadavg()[0], 2), **redeploy(board, src),
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
