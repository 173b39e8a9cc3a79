"""One job per board at a time: the global concurrency limit ``board-<name>`` (one slot) that the
flow ``odl`` and each board's part of a fleet round hold while they use the board.

A fleet's wave of boards makes sure of its boards' limits with :func:`ensure_board_limits`: the
limits this process has seen exist are not asked again, the others are read in one listing and
the missing ones created, so a thousand boards' limits cost a few requests a run, not two a board.
"""

from __future__ import annotations

import threading

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound


def ensure_board_limit(board: str) -> str:
    """Create the global concurrency limit ``board-<name>`` (1 slot) if it does not exist."""
    name = f"board-{board}"
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass
    return name


_KNOWN: set[str] = set()  # board limits this process has seen exist (read or created)
_KNOWN_LOCK = threading.Lock()
PAGE = 200  # limits read per request


def ensure_board_limits(boards: list[str]) -> list[str]:
    """``ensure_board_limit`` for many boards: one listing of the server's limits (paged) when any of
    them is not known to this process yet, then a create for each missing one; their names."""
    names = [f"board-{b}" for b in boards]
    with _KNOWN_LOCK:
        missing = [n for n in names if n not in _KNOWN]
        if not missing:
            return names
        with get_client(sync_client=True) as client:
            offset = 0
            while True:
                page = client.read_global_concurrency_limits(limit=PAGE, offset=offset)
                _KNOWN.update(lim.name for lim in page)
                if len(page) < PAGE:
                    break
                offset += PAGE
            for name in [n for n in missing if n not in _KNOWN]:
                try:
                    client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
                except ObjectAlreadyExists:
                    pass
                _KNOWN.add(name)
    return names


def forget_board_limits() -> None:
    """Ask the server again next time (a limit deleted by hand makes an acquisition fail)."""
    with _KNOWN_LOCK:
        _KNOWN.clear()
