"""Nightly stages: the board's growing dataset, rollout and rollback of the model the board serves
(the warm start from the model in service is :mod:`tasks.stages.warm_start`).

    data = board_data(recipe, board)                      # -> BoardData | None (files + hashes)
    spec, files = job_spec(inp, prep, job, checkpoint=warm.checkpoint, train_data=data.ref)
    ...
    rollout(board, recipe.name, version)                  # -> Installed (hash-verified on the board)
    rollback(board, recipe.name)                          # -> Installed (previous version)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tasks.board.inventory import Board
from tasks.board.joblink import job_link
from tasks.judge.registry import ModelRegistry
from tasks.nightly.board_data import BoardData
from tasks.nightly.board_data import board_data as choose
from tasks.recipe.schema import Recipe
from tasks.stages.judge import registry

log = logging.getLogger(__name__)


def board_data(recipe: Recipe, board: Board, reg: ModelRegistry | None = None) -> BoardData | None:
    """The files of the board's dataset folder this run trains on (``[data] board_dataset``),
    listed and hashed on the board and chosen by ``board_select``; None for other recipes."""
    if recipe.data.board_dataset is None:
        return None
    with job_link(board) as link:
        listing = link.list_dataset(recipe.data.board_dataset, recipe.data.board_format)
    data = choose(recipe, board.name, listing, reg or registry())
    rec = data.record
    log.info("board %s: training on %d of %d files of %s (%d new, %d replayed, %d samples)", board.name,
             len(rec["files"]), rec["folder_files"], rec["path"], len(rec["new"]), len(rec["replayed"]),
             rec["samples"])  # fmt: skip
    return data


@dataclass(frozen=True)
class Installed:
    """What the board serves for a recipe after a rollout or a rollback."""

    board: str
    recipe: str
    version: str
    previous: str | None
    files: dict[str, str]  # release file -> sha256, verified on the board
    answer: dict[str, Any]


def rollout(
    board: Board, recipe: str, version: str, reg: ModelRegistry | None = None, registry_key: str | None = None
) -> Installed:
    """Install registry ``version`` as the board's ``models/<recipe>/current`` (hash-verified);
    ``registry_key`` names the registry entry when it is not the board's (a fleet's group)."""
    chosen = (reg or registry()).version(recipe, registry_key or board.name, version)
    with job_link(board) as link:
        answer = link.install(recipe, chosen)
    current, previous = answer["current"], answer.get("previous") or {}
    log.info("board %s: models/%s/current is %s (previous %s)", board.name, recipe, version,
             previous.get("version"))  # fmt: skip
    return Installed(board.name, recipe, version, previous.get("version"), current["files"], answer)


def rollback(board: Board, recipe: str, reg: ModelRegistry | None = None) -> Installed:
    """Serve the previous version again: on the board first, then in the registry (so a board
    that cannot be reached leaves both as they were)."""
    reg = reg or registry()
    _, previous = reg.rollback_target(recipe, board.name)
    installed = rollout(board, recipe, previous.name, reg)
    reg.rollback(recipe, board.name)
    return installed
