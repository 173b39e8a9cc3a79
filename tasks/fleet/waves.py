"""A round's boards in waves: the few Prefect tasks that carry a thousand boards' parts.

A Prefect task per board costs the server ~10 requests and events a board (its task run, its
states, its slot's lease, its logs); at a thousand boards that is the server's whole round. So a
round's boards are split into at most :data:`WAVES` contiguous waves (as many as the flow's task
runner runs at once, so every board's part is under way together: a pull-mode board that checks
in last does not wait for a wave ahead of it), each wave one task that runs its boards' parts in
threads (:func:`run_parts`) and returns their outcomes in its one result.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tasks.fleet.fanout import split

WAVES = 16  # the fleet flow's ThreadPoolTaskRunner(max_workers=16): every wave runs at once


def waves(boards: list[Any], count: int = WAVES) -> list[list[Any]]:
    """``boards`` in at most ``count`` contiguous waves as even as can be, order kept."""
    return split(boards, count) if boards else []


def label(part: list[Any]) -> str:
    """``b0001..b0063 (63)``: how a wave's task run is named."""
    first, last = part[0].name, part[-1].name
    return f"{first} ({len(part)})" if first == last else f"{first}..{last} ({len(part)})"


def run_parts(names: list[str], part: Callable[[str], Any]) -> dict[str, Any]:
    """``part(name)`` for every name at once, each in a thread of its own; each name's return value
    or the exception it raised."""
    if not names:
        return {}

    def one(name: str) -> Any:
        try:
            return part(name)
        except Exception as exc:  # noqa: BLE001 - the round records why each board is missing
            return exc

    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="board") as pool:
        return dict(zip(names, pool.map(one, names), strict=True))
