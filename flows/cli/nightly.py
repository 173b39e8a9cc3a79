"""``odl registry | rollout | rollback | models | data``: the model versions, the one a board serves,
and the data it grows.

* ``odl registry RECIPE [BOARD]``: the versions of the model registry, the current one marked;
* ``odl rollout RECIPE BOARD [--version vNNNN]``: install the registry's current version (or the
  one named) as the board's ``models/<recipe>/current``, hash-verified;
* ``odl rollback RECIPE BOARD``: serve the previous version again, on the board and in the registry;
* ``odl models RECIPE BOARD``: what the board serves (current and previous, hashes re-verified)
  beside the registry's current;
* ``odl data push BOARD FILE... --to datasets/NAME``: append files to a board dataset folder the
  way a board application must (hidden temporary name, then linked into place; the agent's
  ``add-file``) - the demo's stand-in for the application that collects data on the board;
  ``odl data list BOARD datasets/NAME``.

Every RECIPE, BOARD, ``--to`` folder and pushed file name is checked by the one name rule
(``device_agent.names.NAME``) before anything reaches the board or the registry.
"""

from __future__ import annotations

import argparse
import json
import time

from device_agent.protocol import NAME, check_board_path
from tasks.board.agent import install_agent
from tasks.board.control import list_dataset, push_files
from tasks.board.inventory import get_board
from tasks.board.releases import board_models
from tasks.board.transport import connect
from tasks.errors import DataError, RegistryError
from tasks.fleet.report import privacy_line
from tasks.judge.decision import LINE_CHARS, Decision, decision_from_dict, details, headline
from tasks.judge.registry import Version
from tasks.stages import nightly, registry


def _print(obj: object) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def _recipe(args: argparse.Namespace) -> str:
    """The RECIPE argument once it is a name (it names registry and board folders)."""
    return NAME.check(args.recipe, "recipe", error=RegistryError)


def cmd_registry(args: argparse.Namespace) -> int:
    """``odl registry``: the versions of a recipe+board in the model registry, the current one marked."""
    reg = registry()
    current = reg.current(_recipe(args), args.board)
    for v in reg.versions(args.recipe, args.board):
        mark = "*" if current and v.name == current.name else " "
        head = f"{mark} {v.name}  {'promoted' if v.promoted else 'rejected':<8}  {_recorded(v)}  "
        decision = _decision(v)
        width = LINE_CHARS - len(head)
        print(head + (headline(decision, width) if decision else str(v.info.get("reason", ""))[:width]))
        for line in details(decision, indent=" " * 6) if decision else []:  # why it was rejected
            print(line)
        if isinstance(v.info.get("privacy"), dict):
            print(f"      {privacy_line(v.info['privacy'])}")
        print(f"      run {v.info.get('flow_run_id', '-')}")
    if current is None:
        print("(no current version)")
    return 0


def _recorded(v: Version) -> str:
    at = v.info.get("recorded_at")
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if isinstance(at, (int, float)) else "?"


def _decision(v: Version) -> Decision | None:
    """A version's recorded decision (None for a record without one)."""
    try:
        return decision_from_dict(v.info["decision"])
    except (KeyError, TypeError):
        return None


def cmd_rollout(args: argparse.Namespace) -> int:
    """``odl rollout``: install the registry's current version (or ``--version``) on the board."""
    board, recipe = get_board(args.board), _recipe(args)
    version = args.version
    if version is None:
        current = registry().current(recipe, board.name)
        if current is None:
            raise RegistryError(f"{recipe} on {board.name}: no version in service to roll out")
        version = current.name
    done = nightly.rollout(board, recipe, version)
    print(
        f"board {board.name}: models/{args.recipe}/current.onnx is {done.version} (previous {done.previous})"
    )
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """``odl rollback``: serve the previous version again, on the board and in the registry."""
    board = get_board(args.board)
    done = nightly.rollback(board, _recipe(args))
    print(
        f"rolled back {args.recipe} on {board.name}: {done.version} is in service again "
        f"(board models/{args.recipe}/current.onnx and the registry)"
    )
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """``odl models``: what the board serves for a recipe, beside the registry's current."""
    board = get_board(args.board)
    current = registry().current(_recipe(args), board.name)
    conn = connect(board)
    try:
        answer = board_models(conn, board, args.recipe)
    finally:
        conn.close()
    if args.json:
        _print({"board": answer, "registry_current": current.name if current else None})
        return 0
    print(
        f"{args.recipe} on {board.name}: the registry's current version is {current.name if current else 'none'}"
    )
    for role in ("current", "previous"):
        m = answer.get(role) if isinstance(answer, dict) else None
        if not m:
            print(f"  {role:<8} none on the board")
            continue
        when = m.get("installed_at")
        at = time.strftime("%Y-%m-%d %H:%M", time.localtime(when)) if isinstance(when, (int, float)) else "?"
        ok = "hash-verified" if m.get("verified") else "NOT matching its recorded hashes"
        print(f"  {role:<8} {m.get('version', '?')} installed {at}, {ok}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    """``odl data push``: append files to a board dataset folder (hidden name, then linked)."""
    board = get_board(args.board)
    for answer in push_files(board, args.to, args.files, folder_field="--to"):
        if answer.get("added"):
            print(f"board {board.name}: {answer['path']} ({answer['size']} bytes)")
        else:
            print(f"board {board.name}: {answer['path']} is already there (same sha256)")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """``odl data list``: a board dataset folder's files with sha256 and samples."""
    board = get_board(args.board)
    check_board_path(args.path, "path", error=DataError)
    conn = connect(board)
    try:
        install_agent(conn, board)
        _print(list_dataset(conn, board, args.path, args.format))
    finally:
        conn.close()
    return 0
