"""Machine-wide names of a virtual board, owned by one project home.

A board's state (keys, sshd config, inventory entry) lives under ``$ODL_HOME``, but its Unix user,
network namespace, veth pair and cgroup are names shared by the whole machine. Two checkouts that
both call their board ``vboard`` would otherwise take over each other's user (replacing its key)
and namespace. Every machine-wide name therefore carries a tag of the project home
(``vboard-1a2b3c``: the first 6 hex digits of the sha256 of the resolved ``$ODL_HOME``), so each
home gets its own board of the same inventory name, and ``board_down --purge`` in one home never
touches another's."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from tasks.paths import odl_home


def home_tag(home: Path | None = None) -> str:
    """6 hex digits naming the project home ``home`` (default ``$ODL_HOME``) in machine-wide names."""
    path = Path(home) if home is not None else odl_home()
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:6]


def machine_name(name: str, home: Path | None = None) -> str:
    """Board ``name`` of this home as the machine knows it: ``vboard-1a2b3c`` (at most 27 characters
    for a 20-character board name, so ``odl-`` + it fits a 32-character Unix user name)."""
    return f"{name}-{home_tag(home)}"


def unix_user(name: str, home: Path | None = None) -> str:
    """The board's Unix user: ``odl-vboard-1a2b3c``."""
    return f"odl-{machine_name(name, home)}"


@contextlib.contextmanager
def open_to_board_user() -> Iterator[None]:
    """Run the block under umask 022: what it makes (venvs, cgroups, the sshd's files) is read by the
    board's own Unix user, which a caller's umask 077 (a CI runner's, a hardened root's) would shut
    out (the venv's ``bin/`` 0700: ``Permission denied``, exit 126). Also a decorator."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)
