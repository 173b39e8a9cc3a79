"""``odl rollout | rollback | models | data``: the model a board serves and the data it grows.

* ``odl rollout RECIPE BOARD [--version vNNNN]``: install the registry's current version (or the
  one named) as the board's ``models/<recipe>/current``, hash-verified;
* ``odl rollback RECIPE BOARD``: serve the previous version again, on the board and in the registry;
* ``odl models RECIPE BOARD``: what the board serves (current and previous, hashes re-verified)
  beside the registry's current;
* ``odl data push BOARD FILE... --to datasets/NAME``: append files to a board dataset folder the
  way a board application must (hidden temporary name, then rename) - the demo's stand-in for
  the application that collects data on the board; ``odl data list BOARD datasets/NAME``.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import secrets
from pathlib import Path

# append only: a file already there is never rewritten (jobs pin files by sha256)
APPEND = 'if [ -e "$2" ]; then echo "$2 exists: a dataset folder only grows" >&2; exit 17; fi; cat > "$1" && mv "$1" "$2"'


def register(sub: argparse._SubParsersAction) -> None:
    """Add the nightly commands to the ``odl`` parser."""
    out = sub.add_parser("rollout", help="install a registry version as the board's current model")
    out.add_argument("recipe")
    out.add_argument("board")
    out.add_argument("--version", help="a registry version (default: the registry's current)")
    out.set_defaults(func=_rollout)
    back = sub.add_parser("rollback", help="serve the previous version again (board and registry)")
    back.add_argument("recipe")
    back.add_argument("board")
    back.set_defaults(func=_rollback)
    models = sub.add_parser("models", help="the model the board serves for a recipe, and the registry's")
    models.add_argument("recipe")
    models.add_argument("board")
    models.set_defaults(func=_models)
    data = sub.add_parser("data", help="a board dataset folder: push files to it, list it")
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    push = dsub.add_parser("push", help="append files to a board dataset folder (atomic renames)")
    push.add_argument("board")
    push.add_argument("files", nargs="+", type=Path)
    push.add_argument("--to", required=True, help="the folder on the board, e.g. datasets/digits")
    push.set_defaults(func=_push)
    lst = dsub.add_parser("list", help="the folder's files with sha256 and samples")
    lst.add_argument("board")
    lst.add_argument("path")
    lst.add_argument("--format", default="npz-shards", choices=("npz-shards", "image-folder"))
    lst.set_defaults(func=_list)


def _board(name: str):  # noqa: ANN202
    from tasks.board.inventory import get_board

    return get_board(name)


def _print(obj: object) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def _rollout(args: argparse.Namespace) -> int:
    from tasks.errors import RegistryError
    from tasks.stages import nightly, registry

    board = _board(args.board)
    version = args.version
    if version is None:
        current = registry().current(args.recipe, board.name)
        if current is None:
            raise RegistryError(f"{args.recipe} on {board.name}: no version in service to roll out")
        version = current.name
    done = nightly.rollout(board, args.recipe, version)
    print(
        f"board {board.name}: models/{args.recipe}/current.onnx is {done.version} (previous {done.previous})"
    )
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from tasks.stages import nightly

    board = _board(args.board)
    done = nightly.rollback(board, args.recipe)
    print(
        f"rolled back {args.recipe} on {board.name}: {done.version} is in service again "
        f"(board models/{args.recipe}/current.onnx and the registry)"
    )
    return 0


def _models(args: argparse.Namespace) -> int:
    from tasks.board.transport import connect
    from tasks.nightly.board_ops import board_models
    from tasks.stages import registry

    board = _board(args.board)
    current = registry().current(args.recipe, board.name)
    conn = connect(board)
    try:
        answer = board_models(conn, board, args.recipe)
    finally:
        conn.close()
    _print({"board": answer, "registry_current": current.name if current else None})
    return 0


def _push(args: argparse.Namespace) -> int:
    from tasks.board.transport import connect
    from tasks.errors import DataError
    from tasks.hashing import file_sha256

    board = _board(args.board)
    folder = args.to.strip("/")
    if not folder or ".." in folder.split("/"):
        raise DataError(f"--to: a folder under the agent root without '..' (got {args.to!r})")
    target = posixpath.join(board.root, folder)
    conn = connect(board)
    try:
        conn.run(["mkdir", "-p", target])
        for path in args.files:
            if not path.is_file():
                raise DataError(f"{path}: no such file on the host")
            dest = posixpath.join(target, path.name)
            there = conn.run(["sha256sum", dest], check=False)
            if there.code == 0:  # append only: an existing file is never rewritten
                if there.stdout.split()[0] == file_sha256(path):
                    print(f"board {board.name}: {folder}/{path.name} is already there (same sha256)")
                    continue
                raise DataError(
                    f"board {board.name}: {folder}/{path.name} exists with other content; a dataset "
                    "folder only grows: give the new file another name"
                )
            tmp = posixpath.join(target, f".{path.name}.{secrets.token_hex(4)}.tmp")
            conn.run(["sh", "-c", APPEND, "sh", tmp, dest], input=path.read_bytes())
            print(f"board {board.name}: {folder}/{path.name} ({path.stat().st_size} bytes)")
    finally:
        conn.close()
    return 0


def _list(args: argparse.Namespace) -> int:
    from tasks.board.agent import install_agent
    from tasks.board.transport import connect
    from tasks.nightly.board_ops import list_dataset

    board = _board(args.board)
    conn = connect(board)
    try:
        install_agent(conn, board)
        _print(list_dataset(conn, board, args.path, args.format))
    finally:
        conn.close()
    return 0
