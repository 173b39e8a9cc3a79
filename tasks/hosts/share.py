"""What a simulated host needs to drive the boards: the first home's inventory (boards and groups),
each board's SSH key and the pinned host keys, copied into the host's own home with the paths
rewritten there (deploy/MULTIHOST.md asks the same of a second machine). The shared store of issue
45 (inventory and host keys in PostgreSQL) replaces this copy; until then ``odl hosts sync`` copies
again after boards change."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from tasks.board.inventory import load_groups, load_inventory, save_board, save_group


def share_boards(first: Path, host_home: Path) -> list[str]:
    """Copy the boards of the first home ``first`` into ``host_home``; the names copied."""
    source = first / "inventory.toml"
    boards = load_inventory(source)
    target = host_home / "inventory.toml"
    target.unlink(missing_ok=True)  # boards gone from the first home go from the host too
    for name, board in boards.items():
        copied = dataclasses.replace(
            board,
            key=_copy_private(board.key, host_home / "boards" / name / "id_ed25519"),
            known_hosts=_copy_private(board.known_hosts, host_home / "known_hosts"),
        )
        save_board(copied, target)
    for group, members in load_groups(source).items():
        save_group(group, list(members), target)
    return sorted(boards)


def _copy_private(path: Path | None, to: Path) -> Path | None:
    """``path`` copied to ``to`` (mode 0600, folder 0700), or None when there is none."""
    if path is None or not Path(path).is_file():
        return None
    to.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = to.with_name(f".{to.name}.{os.getpid()}.tmp")
    shutil.copyfile(path, tmp)
    tmp.chmod(0o600)
    os.replace(tmp, to)
    return to
