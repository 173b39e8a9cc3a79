"""Which files of the board's growing dataset a job trains on, pinned by sha256.

``[data] board_dataset`` names a folder on the board that a board application appends to (npz
shards or class folders of images, see device_agent/README.md). ``board_select`` says what to
train on:

* ``"all"``: every file there now;
* ``"new+replay"``: the files the model in service has not learnt from (its own and its warm-start
  ancestors' files, see :func:`seen_files`), plus
  a seeded draw of older files so that they make ``replay`` (a share in [0, 1)) of the samples:
  the model keeps seeing old data and does not forget it;
* ``"v0003"``: exactly the files that version trained on (a run reproduced).

The chosen list (names, sha256, sizes, samples) goes into the job spec, where the agent verifies
each file before training, and into the registry entry of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from device_agent.protocol import DataFile, DataRef
from tasks.errors import DataError, NoNewData, RegistryError
from tasks.judge.continual import learnt_shards
from tasks.judge.registry import ModelRegistry
from tasks.recipe.schema import Recipe
from tasks.recipe.teacher import label_key


@dataclass(frozen=True)
class BoardData:
    """The job's train data on the board and what the registry records of it."""

    ref: DataRef
    record: dict[str, Any]


def seen_files(reg: ModelRegistry, recipe: str, board: str) -> set[tuple[str, str]]:
    """(name, sha256) of every file the model in service has learnt from: the files of the
    current version and of each version it was warm-started from, back to the base weights (after
    a rollback, what only the rolled-back version saw counts as new again)."""
    by_name = {v.name: v for v in reg.versions(recipe, board)}
    seen: set[tuple[str, str]] = set()
    version, visited = reg.current(recipe, board), set()
    while version is not None and version.name not in visited:
        visited.add(version.name)
        for f in (version.info.get("board_data") or {}).get("files", []):
            seen.add((f["name"], f["sha256"]))
        parent = (version.info.get("start_from") or {}).get("from")
        version = by_name.get(parent) if parent else None
    return seen


def select(
    listing: dict[str, Any], mode: str, replay: float, seed: int, seen: set[tuple[str, str]]
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(chosen files in listing order, new names, replayed names) for ``all`` or ``new+replay``."""
    files = listing["files"]
    if mode == "all":
        return list(files), [f["name"] for f in files], []
    new = [f for f in files if (f["name"], f["sha256"]) not in seen]
    old = [f for f in files if (f["name"], f["sha256"]) in seen]
    if not new:
        raise NoNewData(
            f'data.board_select = "new+replay": no new file in {listing["path"]} since the last '
            f"promoted run ({len(files)} files, all learnt by the model in service): the board "
            "application has added nothing to retrain on"
        )
    new_samples = sum(f["samples"] for f in new)
    target = math.ceil(new_samples * replay / (1.0 - replay)) if replay > 0 else 0
    order = np.random.default_rng([seed, len(seen)]).permutation(len(old))
    replayed, got = [], 0
    for i in order:
        if got >= target:
            break
        replayed.append(old[int(i)])
        got += old[int(i)]["samples"]
    keep = {f["name"] for f in new} | {f["name"] for f in replayed}
    chosen = [f for f in files if f["name"] in keep]
    return chosen, [f["name"] for f in new], [f["name"] for f in replayed]


def pinned(reg: ModelRegistry, recipe: str, board: str, version: str, listing: dict[str, Any]) -> list[dict]:
    """The files ``version`` trained on, each still on the board with the same sha256."""
    files = (reg.version(recipe, board, version).info.get("board_data") or {}).get("files")
    if not files:
        raise RegistryError(f"data.board_select = {version!r}: that version trained on no board data files")
    have = {(f["name"], f["sha256"]) for f in listing["files"]}
    gone = [f["name"] for f in files if (f["name"], f["sha256"]) not in have]
    if gone:
        raise DataError(f"data.board_select = {version!r}: {gone[0]} is no longer on the board as trained")
    return files


def board_data(recipe: Recipe, board: str, listing: dict[str, Any], reg: ModelRegistry) -> BoardData:
    """The DataRef (pinned files) and its record for the recipe's board dataset folder."""
    d = recipe.data
    mode = d.board_select
    if not listing["files"]:
        raise DataError(
            f"data.board_dataset: {listing['path']} on {board} holds no {d.board_format} file yet"
        )
    seen = seen_files(reg, recipe.name, board)
    new: list[str] = []
    replayed: list[str] = []
    if mode in ("all", "new+replay"):
        files, new, replayed = select(listing, mode, d.replay, recipe.training.seed, seen)
    else:
        files = pinned(reg, recipe.name, board, mode, listing)
    unlabeled = unlabeled_files(recipe, files)
    if unlabeled and recipe.teacher is None:
        raise DataError(
            f"data.board_dataset: {unlabeled[0]['name']} on {board} has no {label_key(recipe)!r} array "
            f"({len(unlabeled)} unlabeled file(s), {sum(f['samples'] for f in unlabeled)} samples): add a "
            "[teacher] table to label them on the board"
        )
    pins = tuple(DataFile(f["name"], f["sha256"], f["size"], f["samples"]) for f in files)
    classes = tuple(listing.get("classes") or ()) or None
    ref = DataRef(d.board_format, path=d.board_dataset, files=pins, classes=classes)
    record = {
        "path": d.board_dataset,
        "format": d.board_format,
        "select": mode,
        "replay": d.replay,
        "files": [p.to_dict() for p in pins],
        "new": new,
        "replayed": replayed,
        "samples": sum(p.samples for p in pins),
        "folder_files": len(listing["files"]),
        "unlabeled": {
            "files": [f["name"] for f in unlabeled],
            "samples": sum(f["samples"] for f in unlabeled),
            "new_samples": sum(f["samples"] for f in unlabeled if f["name"] in new),
            "label_key": label_key(recipe),
        },
        "learnt": learnt_shards({"files": [p.to_dict() for p in pins]}, seen),  # held-out sets judged on
    }
    return BoardData(ref, record)


def unlabeled_files(recipe: Recipe, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The listed files without the label array (the board's listing names each shard's arrays)."""
    key = label_key(recipe)
    return [f for f in files if "arrays" in f and key not in f["arrays"]]
