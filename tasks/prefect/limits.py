"""One job per board at a time: the global concurrency limit ``board-<name>`` (one slot) that the
flow ``odl`` and each board's part of a fleet round hold while they use the board."""

from __future__ import annotations

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
