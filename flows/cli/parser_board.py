"""The arguments of ``odl board ...`` (virtual boards, the inventory, pull-mode enrolment) and of
``odl endpoint``; :mod:`flows.cli.parser` builds the whole parser. argparse only, like it."""

from __future__ import annotations

from flows.cli.parser_kit import Sub, command

PULL_ROOT = "~/odl"  # tasks.board.inventory.PULL_ROOT (not imported: odl --help imports no pipeline)


def add_board(sub: Sub) -> None:
    """``odl board up | down | status | group | list | info | check``."""
    board = sub.add_parser("board", help="virtual boards (up/down/status) and the inventory (list/info)")
    bsub = board.add_subparsers(dest="board_command", required=True, metavar="ACTION")
    up = command(bsub, "up", "board", "cmd_up",
                  help="bring up a virtual board (private sshd, own user and netns)")  # fmt: skip
    up.add_argument("--name", default="vboard")
    up.add_argument(
        "--profile", help="a board model's RAM, CPUs and CPU quota, e.g. stm32mp25 (flags below override)"
    )
    up.add_argument("--mem-mb", type=int, help="cap the board's RAM (cgroup memory limit, no swap)")
    up.add_argument("--cpus", type=int, help="pin the board to this many CPUs (taskset)")
    up.add_argument("--loopback", action="store_true", help="listen on 127.0.0.1 instead of a netns")
    up.add_argument(
        "--cpu-quota", type=float, metavar="CPUS", help="cap the board's total CPU time (cgroup), e.g. 0.5"
    )
    up.add_argument(
        "--link", metavar="SPEC", help='shape its link, e.g. "rate=10mbit,delay=50ms,loss=1%%" (any subset)'
    )
    up.add_argument(
        "--env", action="append", metavar="NAME=VALUE", help="set in the board's sessions (repeatable)"
    )
    up.add_argument(
        "--arch", help="x86_64 (default) or arm64: aarch64 code under qemu user mode, as a Cortex-A35"
    )
    up.add_argument("--pull", action="store_true",
                    help="a board that can only dial out: behind a NAT router, enrolled with the endpoint (started at the lab gateway)")  # fmt: skip
    up.add_argument("--ort", metavar="BUILD", help="onnxruntime of the board: training (x86_64's default), "
                    "plain or plain==VERSION (arm64's default; deploy/board-requirements-plain.txt)")  # fmt: skip
    down = command(bsub, "down", "board", "cmd_down", help="stop a virtual board (keeps its user and data)")
    down.add_argument("--name", default="vboard")
    down.add_argument("--purge", action="store_true", help="also remove its user, data and inventory entry")
    status = command(bsub, "status", "board", "cmd_status", help="is the virtual board running, and where")
    status.add_argument("--name", default="vboard")
    grp = command(bsub, "group", "board", "cmd_group",
                   help="set an inventory group (a fleet): odl board group lab b1 b2 b3")  # fmt: skip
    grp.add_argument("group")
    grp.add_argument("boards", nargs="+")
    command(bsub, "list", "board", "cmd_list", help="the boards and groups of the inventory")
    info = command(bsub, "info", "board", "cmd_info",
                    help="install/upgrade the agent on a board and print its 'info'")  # fmt: skip
    info.add_argument("name", nargs="?", default="vboard")
    check = command(bsub, "check", "board", "cmd_check",
                     help="is a board ready? SSH, host key, python, numpy, ORT, agent, RAM, disk, clock")  # fmt: skip
    check.add_argument("name", nargs="?", default=None, help="board name (default vboard)")
    check.add_argument("--all", action="store_true", help="every board of the inventory")
    check.add_argument("--json", action="store_true", help="print the items as a JSON list")
    enrol = command(bsub, "enrol", "board", "cmd_enrol",
                     help="add a board that can only dial out (pull mode) and print its one-time enrolment code")  # fmt: skip
    enrol.add_argument("name")
    enrol.add_argument("--root", default=PULL_ROOT, help="the agent root on the board (default %(default)s)")
    enrol.add_argument("--deadline-h", type=float, default=24.0,
                       help="hours a job may wait for the board before it expires (default %(default)s)")  # fmt: skip
    accept = command(
        bsub, "accept", "board", "cmd_accept", help="accept a board that enrolled without a code"
    )
    accept.add_argument("name")
    accept.add_argument(
        "--fingerprint", help="the key fingerprint the board printed (sha256:...): checked first"
    )
    revoke = command(
        bsub, "revoke", "board", "cmd_revoke", help="refuse a pull-mode board's every request from now on"
    )
    revoke.add_argument("name")


def add_endpoint(sub: Sub) -> None:
    """``odl endpoint up | down | status``."""
    p = command(sub, "endpoint", "board", "cmd_endpoint",
                 help="the HTTPS endpoint that boards which can only dial out (pull mode) check in with")  # fmt: skip
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--listen", default="127.0.0.1:8443", help="HOST:PORT to listen on (default %(default)s)")
    p.add_argument("--url", help="the https:// address the boards are given (default: https://LISTEN)")
