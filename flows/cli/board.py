"""``odl board up | down | status | list | info | check``: virtual boards and the board inventory."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``odl board ...`` to the ``odl`` parser."""
    board = sub.add_parser("board", help="virtual boards (up/down/status) and the inventory (list/info)")
    bsub = board.add_subparsers(dest="board_command", required=True, metavar="ACTION")
    up = bsub.add_parser("up", help="bring up a virtual board (private sshd, own user and netns)")
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
    up.set_defaults(func=_up)
    down = bsub.add_parser("down", help="stop a virtual board (keeps its user and data)")
    down.add_argument("--name", default="vboard")
    down.add_argument("--purge", action="store_true", help="also remove its user, data and inventory entry")
    down.set_defaults(func=_down)
    status = bsub.add_parser("status", help="is the virtual board running, and where")
    status.add_argument("--name", default="vboard")
    status.set_defaults(func=_status)
    grp = bsub.add_parser("group", help="set an inventory group (a fleet): odl board group lab b1 b2 b3")
    grp.add_argument("group")
    grp.add_argument("boards", nargs="+")
    grp.set_defaults(func=_group)
    lst = bsub.add_parser("list", help="the boards and groups of the inventory")
    lst.set_defaults(func=_list)
    info = bsub.add_parser("info", help="install/upgrade the agent on a board and print its 'info'")
    info.add_argument("name", nargs="?", default="vboard")
    info.set_defaults(func=_info)
    check = bsub.add_parser(
        "check", help="is a board ready? SSH, host key, python, numpy, ORT, agent, RAM, disk, clock"
    )
    check.add_argument("name", nargs="?", default="vboard")
    check.add_argument("--json", action="store_true", help="print the items as a JSON list")
    check.set_defaults(func=_check)


def _up(args: argparse.Namespace) -> int:
    from tasks.errors import BoardError
    from tasks.vboard.lifecycle import board_up

    env = {}
    for item in args.env or []:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise BoardError(f"--env {item!r}: expected NAME=VALUE")
        env[key] = val
    b = board_up(
        args.name,
        mem_mb=args.mem_mb,
        cpus=args.cpus,
        netns=not args.loopback,
        cpu_quota=args.cpu_quota,
        env=env,
        profile=args.profile,
        link=args.link,
    )
    print(
        f"board {b.name} up: ssh -i {b.key} -o UserKnownHostsFile={b.known_hosts} -p {b.port} {b.user}@{b.host}"
    )
    return 0


def _down(args: argparse.Namespace) -> int:
    from tasks.vboard.lifecycle import board_down

    print(json.dumps(board_down(args.name, purge=args.purge)))
    return 0


def _status(args: argparse.Namespace) -> int:
    from tasks.vboard.lifecycle import board_status

    status = board_status(args.name)
    print(json.dumps(status, indent=2))
    return 0 if status["running"] else 1


def _list(args: argparse.Namespace) -> int:
    from tasks.board.inventory import inventory_path, load_groups, load_inventory
    from tasks.paths import odl_home

    boards = load_inventory()
    print(f"# {inventory_path()}")
    for b in boards.values():
        vb = odl_home() / "boards" / b.name / "state.json"  # a virtual board: its profile and link
        state = json.loads(vb.read_text()) if vb.is_file() else {}
        extra = "".join(f"  {k}={state[k]}" for k in ("profile", "link") if state.get(k))
        print(f"{b.name:16s} {b.user}@{b.host}:{b.port}  root={b.root}  ort={b.ort_version}{extra}")
    for name, members in load_groups().items():
        print(f"group {name:10s} {', '.join(members)}")
    return 0


def _group(args: argparse.Namespace) -> int:
    from tasks.board.inventory import save_group

    print(f"group {args.group} = {', '.join(args.boards)} ({save_group(args.group, args.boards)})")
    return 0


def _info(args: argparse.Namespace) -> int:
    from tasks.board.agent import install_agent
    from tasks.board.inventory import get_board
    from tasks.board.transport import connect

    board = get_board(args.name)
    conn = connect(board)
    try:
        print(json.dumps(install_agent(conn, board).to_dict(), indent=2))
    finally:
        conn.close()
    return 0


def _check(args: argparse.Namespace) -> int:
    from tasks.board.check import print_check
    from tasks.board.inventory import get_board

    return print_check(get_board(args.name), as_json=args.json)
