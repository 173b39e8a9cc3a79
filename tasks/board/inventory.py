"""The board inventory: ``$ODL_HOME/inventory.toml``, one ``[boards.NAME]`` table per board.

A real board and a virtual one are described the same way::

    [boards.mp2-lab]
    host = "192.168.1.40"
    port = 22
    user = "odl"
    key = "/home/me/.ssh/odl_ed25519"        # private key (keys only, no passwords)
    known_hosts = "/home/me/.odl/known_hosts" # pinned host keys; unknown or changed keys are refused
    root = "/home/odl/odl"                    # the agent root on the board
    python = "/usr/bin/python3"               # the board's python3 (numpy + ORT-training)
    ort_version = "1.19.2"                    # expected onnxruntime version on the board
    arch = "aarch64"                          # optional: the board's machine (platform.machine())
    runtimes = ["autograd"]                   # optional: the training runtimes it can run (RUNTIMES)

Without ``runtimes`` the host judges from the agent's ``info`` answer (the ORT training API or not).
A board on this machine (tests, dry runs) names the local transport and needs only its root::

    [boards.here]
    transport = "local"
    root = "/tmp/odl-local"
    python = "/var/tmp/odl-board-venv/bin/python"

Boards that train together (a fleet) are named by a group; every member must be a board above::

    [groups]
    lab = ["mp2-a", "mp2-b", "mp2-c"]

A board (or group) name is a name of the project's one rule (:data:`device_agent.names.NAME`),
narrowed to 1-20 characters of ``[a-z0-9-]`` starting with a letter or digit, since it also names a
virtual board's Unix user, network namespace and folder: :data:`BOARD_NAME` is the rule and
:data:`BOARD_NAME_PATTERN` its pattern, used by the inventory, the command line and the flow's
parameters. A wrong entry refuses the inventory with one line naming the file and the entry.

With a shared store (``ODL_STORE_URL``) the inventory and the boards' pinned host keys are read
through it: :mod:`tasks.board.shared_inventory` says how the local file is kept in step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device_agent.protocol import NAME
from tasks.board.inventory_values import RUNTIMES, convert, toml_value
from tasks.board.shared_inventory import pull_inventory, push_host_keys, shared_edit
from tasks.errors import BoardError
from tasks.paths import home_hint, odl_home

BOARD_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,19}$"
BOARD_NAME = NAME.narrowed(
    BOARD_NAME_PATTERN, 20, "1-20 characters of a-z 0-9 -, starting with a letter or digit "
    "(it also names a virtual board's Unix user and network namespace)",
)  # fmt: skip
TRANSPORTS = ("ssh", "local", "pull")
__all__ = ["BOARD_NAME", "BOARD_NAME_PATTERN", "RUNTIMES", "TRANSPORTS", "Board", "get_board", "get_group",
           "inventory_path", "load_groups", "load_inventory", "remove_board", "save_board", "save_group",
           "valid_board_name"]  # fmt: skip
REQUIRED = {"ssh": ("host", "user", "key", "root"), "local": ("root",), "pull": ()}
PULL_ROOT = "~/odl"  # a pull-mode board's agent root when its entry does not say (the board decides)


@dataclass(frozen=True)
class Board:
    """How the host reaches one board and where the agent lives on it."""

    name: str
    root: str
    host: str = "localhost"
    user: str = ""
    key: Path | None = None
    transport: str = "ssh"
    port: int = 22
    known_hosts: Path | None = None
    python: str = "python3"
    ort_version: str = "1.19.2"
    connect_timeout: float = 10.0
    arch: str = ""  # "" when not stated
    runtimes: tuple[str, ...] = ()  # () when not stated: judged from the agent's info answer
    pull_deadline_h: float = 24.0  # pull mode: a job the board has not ended by then expires

    def to_toml(self) -> str:
        """The board's ``[boards.NAME]`` table as TOML text."""
        lines = [f"[boards.{self.name}]"]
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            if f.name == "name" or val is None or val == "" or val == ():
                continue
            if f.name == "pull_deadline_h" and self.transport != "pull":
                continue
            lines.append(f"{f.name} = {toml_value(val)}")
        return "\n".join(lines) + "\n"


def valid_board_name(
    name: object, field: str = "board name", path: Path | None = None, entry: str = ""
) -> str:
    """Return ``name`` if it is a board name (:data:`BOARD_NAME`), else BoardError with the one
    refusal line (naming ``path`` and its ``entry`` when the name was read there)."""
    return BOARD_NAME.check(name, field, source=str(path or ""), entry=entry, error=BoardError)


def inventory_path() -> Path:
    """The inventory file: ``$ODL_INVENTORY`` or ``$ODL_HOME/inventory.toml``."""
    return Path(os.environ.get("ODL_INVENTORY") or odl_home() / "inventory.toml")


def load_inventory(path: Path | None = None) -> dict[str, Board]:
    """Read every board of the inventory; a wrong entry raises BoardError naming the field. The default
    inventory is first brought up to date from the shared store, when one is configured."""
    if path is None:
        path = inventory_path()
        pull_inventory(path, load_inventory)
    if not path.exists():
        return {}
    text = path.read_bytes()
    stamp = hashlib.sha256(text).digest()
    cached = _READ.get(str(path))
    if cached is not None and cached[0] == stamp:
        return dict(cached[1])
    try:
        raw = tomllib.loads(text.decode())
    except tomllib.TOMLDecodeError as exc:
        raise BoardError(f"{path}: not valid TOML ({exc})") from exc
    boards = raw.get("boards", {})
    if not isinstance(boards, dict):
        raise BoardError(f"{path}: 'boards' must be a table of [boards.NAME] tables")
    parsed = {name: _parse_board(name, entry, path) for name, entry in boards.items()}
    _READ[str(path)] = (stamp, parsed)
    return dict(parsed)


# each inventory file as last parsed, by the sha256 of its text: parsed again only when it changed
# (a round of a thousand boards reads it ~2 000 times; parsing is 53 ms at that size, hashing ~0.3)
_READ: dict[str, tuple[bytes, dict[str, Board]]] = {}


def get_board(name: str, path: Path | None = None) -> Board:
    """The inventory entry of board ``name``; BoardError listing the known boards when absent."""
    valid_board_name(name, "board")
    boards = load_inventory(path)
    if name not in boards:
        known = ", ".join(sorted(boards)) or "none"
        raise BoardError(
            f"board {name!r} is not in {path or inventory_path()} (known boards: {known}; {home_hint()})"
        )
    return boards[name]


def save_board(board: Board, path: Path | None = None) -> Path:
    """Add or replace ``board`` in the inventory (other boards and the groups are kept); atomic write."""
    shared, path = path is None, path or inventory_path()
    valid_board_name(board.name)  # it is written as a TOML table name
    with shared_edit(path, shared):
        boards = load_inventory(path)
        boards[board.name] = board
        written = _write(path, boards, _raw_groups(path))
    if shared:
        push_host_keys(board)
    return written


def remove_board(name: str, path: Path | None = None) -> bool:
    """Remove board ``name`` from the inventory (and from its groups); True when it was there."""
    shared, path = path is None, path or inventory_path()
    with shared_edit(path, shared):
        boards = load_inventory(path)
        if boards.pop(name, None) is None:
            return False
        groups = {g: [b for b in members if b != name] for g, members in _raw_groups(path).items()}
        _write(path, boards, groups)
    return True


def load_groups(path: Path | None = None) -> dict[str, tuple[str, ...]]:
    """The inventory's ``[groups]``: name -> member board names; BoardError naming a wrong entry."""
    path = path or inventory_path()
    boards = load_inventory(path)
    groups: dict[str, tuple[str, ...]] = {}
    for name, members in _raw_groups(path).items():
        where = f"{path}: [groups] {name}"
        valid_board_name(name, "group name", path, f"[groups] {name}")
        if name in boards:  # the registry keys a fleet's versions by its group name
            raise BoardError(f"{where}: a group cannot share a board's name")
        if not isinstance(members, list) or not members or not all(isinstance(m, str) for m in members):
            raise BoardError(f"{where}: expected a non-empty list of board names (got {members!r})")
        for member in members:
            valid_board_name(member, "board name", path, f"[groups] {name}")
        if len(set(members)) != len(members):
            raise BoardError(f"{where}: a board is listed twice ({members})")
        unknown = [m for m in members if m not in boards]
        if unknown:
            raise BoardError(
                f"{where}: board {unknown[0]!r} is not in the inventory (known boards: "
                f"{', '.join(sorted(boards)) or 'none'})"
            )
        groups[name] = tuple(members)
    return groups


def get_group(name: str, path: Path | None = None) -> list[Board]:
    """The boards of group ``name``; BoardError listing the known groups when absent."""
    valid_board_name(name, "group")
    groups = load_groups(path)
    if name not in groups:
        known = ", ".join(sorted(groups)) or "none"
        raise BoardError(
            f"group {name!r} is not in {path or inventory_path()} [groups] (known groups: {known})"
        )
    boards = load_inventory(path)
    return [boards[b] for b in groups[name]]


def save_group(name: str, members: list[str], path: Path | None = None) -> Path:
    """Set group ``name`` to ``members`` (boards of the inventory); atomic write."""
    shared, path = path is None, path or inventory_path()
    valid_board_name(name, "group name")
    for member in members:
        valid_board_name(member, "board name")
    with shared_edit(path, shared):
        boards = load_inventory(path)
        unknown = [m for m in members if m not in boards]
        if unknown or not members:
            raise BoardError(f"group {name!r}: board {unknown[0] if unknown else None!r} is not in {path}")
        return _write(path, boards, {**_raw_groups(path), name: list(members)})


def _raw_groups(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        groups = tomllib.loads(path.read_text()).get("groups", {})
    except tomllib.TOMLDecodeError as exc:
        raise BoardError(f"{path}: not valid TOML ({exc})") from exc
    if not isinstance(groups, dict):
        raise BoardError(f"{path}: 'groups' must be a table of name = [board, ...]")
    return groups


def _write(path: Path, boards: dict[str, Board], groups: dict[str, Any]) -> Path:
    text = "# ODL board inventory (see deploy/inventory.example.toml)\n\n"
    text += "\n".join(b.to_toml() for _, b in sorted(boards.items()))
    if groups:
        text += "\n[groups]\n" + "".join(
            f"{g} = [{', '.join(toml_value(m) for m in members)}]\n" for g, members in sorted(groups.items())
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def _parse_board(name: str, entry: Any, path: Path) -> Board:
    where = f"{path}: [boards.{name}]"
    valid_board_name(name, "board name", path, f"[boards.{name}]")
    if not isinstance(entry, dict):
        raise BoardError(f"{where}: expected a table")
    fields = {f.name: f for f in dataclasses.fields(Board)}
    unknown = sorted(set(entry) - set(fields))
    if unknown:
        raise BoardError(f"{where}: unknown key '{unknown[0]}' (expected one of {', '.join(sorted(fields))})")
    transport = entry.get("transport", "ssh")
    if transport not in TRANSPORTS:
        raise BoardError(
            f"{where}: key 'transport': expected one of {', '.join(TRANSPORTS)} (got {transport!r})"
        )
    missing = [k for k in REQUIRED[transport] if k not in entry]
    if missing:
        raise BoardError(f"{where}: missing key '{missing[0]}'")
    vals: dict[str, Any] = {"name": name, **({"root": PULL_ROOT} if transport == "pull" else {})}
    for key, val in entry.items():
        vals[key] = convert(where, key, val)
    return Board(**vals)
