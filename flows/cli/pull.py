"""``odl endpoint up | down | status`` and ``odl board enrol | accept | revoke``: boards that can
only dial out (pull mode) and the host endpoint they dial.

``odl board enrol NAME`` adds the board to the inventory (``transport = "pull"``) and prints, once,
the commands to run on the board: its one-time code, the endpoint's address and the pin of its
certificate. The code is shown on this terminal only (never logged, never a flow parameter) and
lapses after a day or its first use.
"""

from __future__ import annotations

import argparse
import json
import time

from tasks.board.inventory import PULL_ROOT, Board, get_board, load_inventory, save_board, valid_board_name
from tasks.board.pull.link import ago
from tasks.board.pull.mailbox import Mailbox
from tasks.board.pull.trust import key_fingerprint
from tasks.errors import BoardError
from tasks.paths import odl_home
from tasks.stack import StackError
from tasks.stack.endpoint import DEFAULT_PORT, endpoint_config, start, stop
from tasks.stack.processes import running_pid
from tasks.vboard.natnet import ensure_gateway


def cmd_endpoint(args: argparse.Namespace) -> int:
    """``odl endpoint up | down | status``."""
    home = odl_home()
    if args.action == "up":
        cfg = start(args.listen, args.url, home)
        print(f"endpoint up: boards dial {cfg.url} (listening on {cfg.listen}), certificate pin {cfg.pin}")
        return 0
    if args.action == "down":
        print("endpoint stopped" if stop(home) else "endpoint was not running")
        return 0
    cfg = endpoint_config()
    pid = running_pid(home, "endpoint")
    print(json.dumps({"running": pid is not None, "pid": pid, **(cfg.__dict__ if cfg else {})}, indent=2))
    return 0


def cmd_enrol(args: argparse.Namespace) -> int:
    """``odl board enrol NAME``: a pull-mode inventory entry and a one-time code for the board."""
    name = valid_board_name(args.name, "board")
    cfg = endpoint_config()
    if cfg is None:
        raise StackError(
            "no endpoint is configured: `odl endpoint up --listen HOST:PORT --url https://HOST:PORT` first"
        )
    existing = load_inventory().get(name)
    if existing is not None and existing.transport != "pull":
        raise BoardError(f"board {name} is in the inventory with transport {existing.transport!r}: "
                         "choose another name, or remove that entry first")  # fmt: skip
    code = Mailbox().invite(name)
    save_board(Board(name, PULL_ROOT, transport="pull", pull_deadline_h=args.deadline_h))
    print(
        f"board {name} added to the inventory as a pull-mode board; on the board (the code works once, for a day):\n"
    )
    print(f"  python3 -m device_agent --root {args.root} enrol --endpoint {cfg.url} \\\n"
          f"      --pin {cfg.pin} --name {name} --code {code}")  # fmt: skip
    print(
        f"  python3 -m device_agent --root {args.root} pull    # or the service: deploy/board/odl-pull.service"
    )
    return 0


def cmd_accept(args: argparse.Namespace) -> int:
    """``odl board accept NAME``: accept a board that enrolled without a code, its key checked."""
    mailbox = Mailbox()
    record = mailbox.board(args.name)
    if record is None or record.public_key is None:
        raise BoardError(f"board {args.name} has not asked to enrol")
    print_fp = key_fingerprint(record.public_key)
    if args.fingerprint and args.fingerprint != print_fp:
        raise BoardError(
            f"board {args.name}: its key's fingerprint is {print_fp}, not {args.fingerprint}: not accepted"
        )
    mailbox.accept(args.name)
    if args.name not in load_inventory():
        save_board(Board(args.name, PULL_ROOT, transport="pull"))
    print(f"board {args.name} accepted (key {print_fp})")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    """``odl board revoke NAME``: refuse the board's every request from the next one on."""
    get_board(args.name)
    record = Mailbox().revoke(args.name)
    print(f"board {args.name} revoked: its next request is refused (its open jobs expired) at "
          f"{time.strftime('%H:%M:%S', time.localtime(record.since))}")  # fmt: skip
    return 0


def lab_endpoint() -> tuple[str, str]:
    """The url and pin of the endpoint at this home's lab gateway (the address virtual pull boards
    dial), started there when it does not run; BoardError when it runs elsewhere."""
    gateway = ensure_gateway()
    cfg, home = endpoint_config(), odl_home()
    if cfg is not None and running_pid(home, "endpoint") is not None:
        if cfg.host_port[0] not in (gateway, "0.0.0.0"):
            raise BoardError(f"the endpoint listens on {cfg.listen}, which virtual pull boards cannot reach: "
                             f"`odl endpoint down`, then `odl board up --pull` starts it at {gateway}")  # fmt: skip
        return cfg.url, cfg.pin
    listen = f"{gateway}:{cfg.host_port[1] if cfg is not None else DEFAULT_PORT}"
    cfg = start(listen, f"https://{listen}", home)
    return cfg.url, cfg.pin


def pull_state(name: str) -> dict[str, object]:
    """A pull-mode board's enrolment state and last check-in, for ``odl board list``."""
    record = Mailbox().board(name)
    if record is None:
        return {"state": "not enrolled", "last_seen": "never"}
    return {"state": record.state, "last_seen": ago(record.seen_s)}
