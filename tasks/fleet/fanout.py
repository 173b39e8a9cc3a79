"""A fleet round fanned out over the work pool's hosts, as plain functions (issue 45).

The round's boards are split into groups; each group becomes a run of the deployment
``odl/fleet-group`` (:mod:`flows.fleet_group`) on whichever host's worker takes it. The hosts
share no filesystem, so the round's global weights travel in the group run's parameters and each
board's update back in the run's result record (:data:`RESULT_TYPE`, an artifact of the group run
on the Prefect server): ``trainable.npz`` byte for byte, so the first host aggregates exactly what
the boards sent (:meth:`tasks.fleet.rounds.FleetRun.close_round`, the one-host code).
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import FleetError, Straggler
from tasks.fleet.board_round import BoardUpdate
from tasks.fleet.weights import Weights

RESULT_TYPE = "odl-fleet-updates"  # the group run's artifact holding its boards' updates
GROUP_DEPLOYMENT = "odl/fleet-group"


def split(boards: list[str], groups: int) -> list[list[str]]:
    """``boards`` in ``groups`` contiguous groups as even as can be (none empty), order kept."""
    if groups < 1:
        raise FleetError(f"fanout {groups}: at least one group")
    groups = min(groups, len(boards))
    size, extra = divmod(len(boards), groups)
    out, start = [], 0
    for g in range(groups):
        end = start + size + (1 if g < extra else 0)
        out.append(boards[start:end])
        start = end
    return out


def pack_weights(weights: Weights) -> str:
    """The weights as base64 text of an ``.npz`` (names, dtypes and values exact)."""
    buf = io.BytesIO()
    np.savez(buf, **weights)
    return base64.b64encode(buf.getvalue()).decode()


def unpack_weights(text: str) -> Weights:
    with np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def entry(name: str, res: BoardUpdate | BaseException | None, host: str) -> dict[str, Any]:
    """One board's part of a group run as JSON: its update's fields and ``trainable.npz`` bytes
    (base64), or why it has none (``late``: a straggler)."""
    if isinstance(res, BoardUpdate):
        row = {k: v for k, v in vars(res).items() if k not in ("update",)}
        return {**row, "host": host, "npz": base64.b64encode(res.update.read_bytes()).decode()}
    late = isinstance(res, Straggler)
    why = "no result (the group's wait ended first)" if res is None else f"{type(res).__name__}: {res}"
    return {"board": name, "host": host, "late": late, "error": why[:400]}


def received(item: dict[str, Any], out_dir: Path) -> BoardUpdate | BaseException:
    """A board's entry back on the first host: its ``trainable.npz`` written under ``out_dir`` (as
    the one-host round retrieves it) and its BoardUpdate, else the Straggler or FleetError it was."""
    if "npz" not in item:
        cls = Straggler if item.get("late") else FleetError
        return cls(f"on host {item.get('host', '?')}: {item.get('error', 'no update')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "trainable.npz"
    tmp = path.with_name(f".trainable.{os.getpid()}.tmp")
    tmp.write_bytes(base64.b64decode(item["npz"]))
    os.replace(tmp, path)
    fields = {k: v for k, v in item.items() if k not in ("npz", "host")}
    return BoardUpdate(**fields, update=path)


def group_failed(part: list[str], why: str) -> dict[str, BaseException]:
    """Every board of a group whose run ended without updates, with the run's reason."""
    return {name: FleetError(why) for name in part}


def payload_bytes(items: list[dict[str, Any]]) -> int:
    """The base64 bytes of updates a group run sent back through the server."""
    return sum(len(i.get("npz", "")) for i in items)
