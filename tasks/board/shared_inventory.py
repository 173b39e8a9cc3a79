"""The inventory and the boards' pinned host keys, read through the shared store (``ODL_STORE_URL``).

Without a store nothing here acts: ``$ODL_HOME/inventory.toml`` (or ``$ODL_INVENTORY``) and each
board's ``known_hosts`` file are the only copies, as before. With one, the local files are this host's
copy of the store's documents (table ``odl_documents``), kept in step this way:

- **Reading** the default inventory (``load_inventory()`` without a path, which every command and
  flow does) first asks the documents' stamp (the inventory's revision and the pinned keys', ~100
  bytes) and, only when it moved since this process's last pull or the local file changed, pulls
  document ``inventory.toml``: when the store's text differs from the local file, the local file is
  replaced by it (written whole, then renamed). When the store has none yet
  and a local file exists, the local one is pushed: the first host seeds the store.
- **Changing** it (``save_board``, ``remove_board``, ``save_group`` without a path) holds the
  document's lock for the whole edit: pull, change the local file, push the result as the next
  revision. Two hosts editing at once both land, one after the other; neither overwrites the other.
- **Pinned host keys**: document ``known_hosts/<board>`` holds the lines of the board's known_hosts
  file that name its ``host:port`` (plain names; hashed lines stay local). They are pushed when the
  board is saved (``odl board add``, a virtual board's ``up`` pins its key first), and pulled with
  the inventory: in the board's local known_hosts file the lines for its ``host:port`` are replaced
  by the store's. The store is authoritative: a key pinned on one host is pinned on every host;
  a key is changed everywhere only by saving the board again where it was re-pinned.
- Never shared: the board's private ``key`` (each host keeps its own copy at the entry's path), and
  an inventory given by an explicit path (tests, ``--inventory``-style callers): those stay local.

Paths inside the inventory (``key``, ``known_hosts``, ``root`` of a local transport) are taken as
they are written: they must be valid on every host that drives the board.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from tasks.store import Documents, configured_store

INVENTORY = "inventory.toml"
KEYS = "known_hosts/"


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.shared")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def _host_field(board: Any) -> str:
    return board.host if int(board.port) == 22 else f"[{board.host}]:{board.port}"


def _pinned_lines(board: Any) -> list[str]:
    """The lines of ``board``'s known_hosts file that pin its host:port (plain names only)."""
    path = board.known_hosts
    if path is None or not Path(path).is_file():
        return []
    name = _host_field(board)
    return [ln for ln in Path(path).read_text().splitlines() if ln.split(" ", 1)[0].split(",")[0] == name]


def pull_inventory(path: Path, load: Callable[[Path], dict[str, Any]]) -> None:
    """Bring the local inventory ``path`` and its boards' pinned keys up to date from the store;
    ``load`` reads an inventory file (the inventory's own reader, given a path: no pull again)."""
    store = configured_store()
    if store is None:
        return
    docs = Documents(store)
    stamp = docs.stamp(INVENTORY, KEYS)  # one small query: the documents are read when it moved
    key = f"{store.cfg.url} {path}"
    if stamp[0] and _PULLED.get(key) == (stamp, _file_stamp(path)):
        return
    shared = docs.get(INVENTORY).content
    local = path.read_bytes() if path.is_file() else None
    if shared is None:
        if local is not None:
            with docs.update(INVENTORY) as doc:
                doc.content = doc.content if doc.content is not None else local
        return
    if shared != local:
        _write(path, shared)
    keys = docs.get_many(KEYS)
    for name, board in load(path).items():
        if f"{KEYS}{name}" in keys and board.known_hosts is not None:
            _merge_keys(board, keys[f"{KEYS}{name}"].decode().splitlines())
    _PULLED[key] = (stamp, _file_stamp(path))


# per store and inventory file: the documents' stamp at the last pull and the file as it left it, so a
# read pulls again only when either changed (a thousand boards' round reads the inventory ~2 000
# times; it used to pull the whole inventory and every pinned key each time: O(N^2) bytes a round)
_PULLED: dict[str, tuple[tuple[int, int, int], tuple[int, int, int] | None]] = {}


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _merge_keys(board: Any, lines: list[str]) -> None:
    """Make the board's known_hosts pin exactly ``lines`` for its host:port (other lines kept)."""
    path = Path(board.known_hosts)
    name = _host_field(board)
    text = path.read_text() if path.is_file() else ""
    others = [ln for ln in text.splitlines() if ln.split(" ", 1)[0].split(",")[0] != name]
    wanted = "".join(f"{ln}\n" for ln in [*others, *lines])
    if wanted != text:
        _write(path, wanted.encode())


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    store = configured_store()
    if store is None:
        yield
        return
    with Documents(store).update(INVENTORY) as doc:
        if doc.content is not None and (not path.is_file() or path.read_bytes() != doc.content):
            _write(path, doc.content)
        yield
        if path.is_file():
            doc.content = path.read_bytes()


def shared_edit(path: Path, shared: bool):
    """The context of a change of the inventory ``path``: under the store's lock when ``shared`` and
    a store is configured (pull, change, push), else nothing."""
    return _locked(path) if shared else nullcontext()


def push_host_keys(board: Any) -> None:
    """Share the lines pinning ``board``'s host key (when its known_hosts file has any)."""
    store = configured_store()
    lines = _pinned_lines(board)
    if store is None or not lines:
        return
    with Documents(store).update(f"{KEYS}{board.name}") as doc:
        doc.content = "".join(f"{ln}\n" for ln in lines).encode()
