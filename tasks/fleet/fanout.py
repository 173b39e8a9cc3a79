"""A fleet round fanned out over the work pool's hosts, as plain functions (issue 45).

The round's boards are split into groups; each group becomes a run of the deployment
``odl/fleet-group`` (:mod:`flows.fleet_group`) on whichever host's worker takes it. The hosts
share no filesystem. With a shared store (``ODL_STORE_URL``) the round's global weights and each
board's ``trainable.npz`` go into the store's blobs, and the group run's parameters and its result
record (:data:`RESULT_TYPE`, an artifact of the group run) name them by their sha256: nothing
model-sized goes through Prefect's API and database. Without one they travel there as base64. Either
way byte for byte, so the first host aggregates exactly what the boards sent
(:meth:`tasks.fleet.rounds.FleetRun.close_round`, the one-host code).
"""

from __future__ import annotations

import base64
import io
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import FleetError, Straggler
from tasks.fleet.board_round import BoardUpdate
from tasks.fleet.weights import Weights
from tasks.store import PgBlobStore, configured_store

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


BY_HASH = "sha256:"  # a parameter or entry naming a blob of the shared store, not holding its bytes


def _blobs() -> Any:
    """The shared store's blobs (``ODL_STORE_URL``), None without a store."""
    store = configured_store()
    return PgBlobStore(store) if store is not None else None


def pack_weights(weights: Weights, folder: Path | None = None) -> str:
    """The weights as an ``.npz`` (names, dtypes and values exact): with a shared store, put there
    and named by its hash (``sha256:<hex>``: nothing model-sized goes through Prefect's API); without
    one, the file as base64 text (the group run's parameters carry it)."""
    buf = io.BytesIO()
    np.savez(buf, **weights)
    blobs = _blobs()
    if blobs is None:
        return base64.b64encode(buf.getvalue()).decode()
    folder = folder or Path(tempfile.mkdtemp(prefix="odl-weights-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "global-weights.npz"
    path.write_bytes(buf.getvalue())
    return BY_HASH + blobs.put(path)


def unpack_weights(text: str, folder: Path | None = None) -> Weights:
    """:func:`pack_weights`'s weights back: fetched from the store (verified) when it names a hash."""
    if text.startswith(BY_HASH):
        blobs = _blobs()
        if blobs is None:
            raise FleetError(f"the round's weights are blob {text[len(BY_HASH):][:12]} of a shared store, "
                             "and this host has none configured (ODL_STORE_URL)")  # fmt: skip
        dest = (folder or Path(tempfile.mkdtemp(prefix="odl-weights-"))) / "global-weights.npz"
        raw = blobs.fetch(text[len(BY_HASH) :], dest).read_bytes()
    else:
        raw = base64.b64decode(text)
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def entry(name: str, res: BoardUpdate | BaseException | None, host: str) -> dict[str, Any]:
    """One board's part of a group run as JSON: its update's fields and ``trainable.npz`` bytes
    (base64), or why it has none (``late``: a straggler)."""
    if isinstance(res, BoardUpdate):
        row = {k: v for k, v in vars(res).items() if k not in ("update",)}
        blobs = _blobs()
        if blobs is not None:  # the update in the store, the entry naming its hash
            return {**row, "host": host, "npz": BY_HASH + blobs.put(res.update)}
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
    if item["npz"].startswith(BY_HASH):
        blobs = _blobs()
        if blobs is None:
            return FleetError(f"on host {item.get('host', '?')}: the update is a blob of a shared store, "
                              "and this host has none configured (ODL_STORE_URL)")  # fmt: skip
        blobs.fetch(item["npz"][len(BY_HASH) :], path)  # verified against its hash, written whole
    else:
        tmp = path.with_name(f".trainable.{os.getpid()}.tmp")
        tmp.write_bytes(base64.b64decode(item["npz"]))
        os.replace(tmp, path)
    fields = {k: v for k, v in item.items() if k not in ("npz", "host")}
    return BoardUpdate(**fields, update=path)


def group_failed(part: list[str], why: str) -> dict[str, BaseException]:
    """Every board of a group whose run ended without updates, with the run's reason."""
    return {name: FleetError(why) for name in part}


def payload_bytes(items: list[dict[str, Any]]) -> int:
    """The bytes of updates a group run sent back through the server (base64 text, or the hashes
    naming them in the store)."""
    return sum(len(i.get("npz", "")) for i in items)
