"""``odl board up | down | status | group | list | info | check``: virtual boards and the board inventory;
``odl board enrol | accept | revoke`` and ``odl endpoint`` are :mod:`flows.cli.pull`'s, run from here."""

from __future__ import annotations

import argparse
import json
import os
import time

from flows.cli.pull import cmd_accept, cmd_endpoint, cmd_enrol, cmd_revoke, lab_endpoint, pull_state
from tasks.board.agent import install_agent
from tasks.board.check import check_board, exit_code, report
from tasks.board.check_items import FAIL, SKIPPED
from tasks.board.inventory import get_board, inventory_path, load_groups, load_inventory, save_group
from tasks.board.transport import connect
from tasks.errors import BoardError
from tasks.paths import odl_home
from tasks.prefect import boards
from tasks.stack import ownership, server
from tasks.vboard.lifecycle import board_down, board_status, board_up

__all__ = [
    "cmd_accept",
    "cmd_endpoint",
    "cmd_enrol",
    "cmd_revoke",
]  # flows.cli.pull's, dispatched as this area's


def cmd_up(args: argparse.Namespace) -> int:
    """``odl board up``: bring up a virtual board, print how to reach it."""
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
        arch=args.arch,
        ort=args.ort,
        pull=lab_endpoint() if args.pull else None,
    )
    what = f"{b.arch}, onnxruntime {b.ort_version}, runtimes {', '.join(b.runtimes)}"
    if b.transport == "pull":
        print(
            f"board {b.name} up behind NAT ({what}): it dials the endpoint; `odl board list` shows its check-ins"
        )
        return 0
    print(
        f"board {b.name} up ({what}): ssh -i {b.key} -o UserKnownHostsFile={b.known_hosts} -p {b.port} {b.user}@{b.host}"
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """``odl board down``: stop a virtual board (``--purge``: and remove it)."""
    print(down_line(board_down(args.name, purge=args.purge)))
    return 0


def down_line(done: dict) -> str:
    """``odl board down``'s one line (``make down`` ends on it): what stopped, what is kept."""
    name = done["name"]
    if done["purged"]:
        return f"board {name} removed: its user, data and inventory entry are gone"
    what = "stopped" if done["stopped_sshd"] else "was not running"
    return f"board {name} {what}; its user, data and inventory entry are kept (--purge removes them)"


def cmd_status(args: argparse.Namespace) -> int:
    """``odl board status``: the virtual board's state; exit 1 when it is not running."""
    status = board_status(args.name)
    print(json.dumps(status, indent=2))
    return 0 if status["running"] else 1


def cmd_list(args: argparse.Namespace) -> int:
    """``odl board list``: the boards and groups of the inventory."""
    boards = load_inventory()
    print(f"# {inventory_path()}")
    for b in boards.values():
        vb = odl_home() / "boards" / b.name / "state.json"  # a virtual board: its profile and link
        state = json.loads(vb.read_text()) if vb.is_file() else {}
        extra = "".join(f"  {k}={state[k]}" for k in ("profile", "link") if state.get(k))
        if b.transport == "pull":  # it dials the host's endpoint: its enrolment and last check-in
            seen = pull_state(b.name)
            print(f"{b.name:16s} pull ({seen['state']}, last seen {seen['last_seen']})  ort={b.ort_version}")
            continue
        print(
            f"{b.name:16s} {b.transport} {b.user}@{b.host}:{b.port}  root={b.root}  ort={b.ort_version}{extra}"
        )
    for name, members in load_groups().items():
        print(f"group {name:10s} {', '.join(members)}")
    return 0


def cmd_group(args: argparse.Namespace) -> int:
    """``odl board group``: set an inventory group (a fleet)."""
    print(f"group {args.group} = {', '.join(args.boards)} ({save_group(args.group, args.boards)})")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """``odl board info``: install or upgrade the agent on a board and print its ``info``."""
    board = get_board(args.name)
    conn = connect(board)
    try:
        print(json.dumps(install_agent(conn, board).to_dict(), indent=2))
    finally:
        conn.close()
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``odl board check [NAME | --all]``: is a board ready (SSH, host key, python, ORT, agent, RAM,
    disk, clock). Each check is a heartbeat event on this home's Prefect server (when its stack is
    up) and refreshes the fleet overview artifact ``odl-boards``."""
    names = sorted(load_inventory()) if args.all else [args.name or "vboard"]
    use_stack()
    worst = 0
    for name in names:
        board = get_board(name)
        start = time.monotonic()
        checks = check_board(board)
        print(json.dumps([c.to_dict() for c in checks], indent=2) if args.json
              else report(board, checks, time.monotonic() - start))  # fmt: skip
        found = {c.name: c for c in checks}
        reachable = found["ssh"].status != FAIL
        detail = {  # "55.4 GB free of 252.0 GB at /home/...": the overview keeps "55.4 GB free of 252.0 GB"
            k: found[k].value.split(" at ")[0].split(" (")[0]
            for k in ("ram", "disk")
            if k in found and found[k].status != SKIPPED
        }
        boards.heartbeat(board.name, reachable, detail)
        worst = worst or exit_code(checks)
    from tasks.judge.registry_open import open_registry  # the shared store's driver only for a check

    boards.publish_overview(sorted(load_inventory()), open_registry())
    boards.flush()
    return worst


def use_stack() -> None:
    """Point Prefect at this home's stack when it runs (identity checked), so events and the
    overview reach its UI; without one they are skipped."""
    env = server.stack_env()
    if "PREFECT_API_URL" not in os.environ and ownership.is_ours(env):
        os.environ["PREFECT_API_URL"] = env["PREFECT_API_URL"]
