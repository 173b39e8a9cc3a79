"""The models a board serves (``models/<recipe>/current`` and ``previous``): install a registry
version's files as the current release, verified on the board against the registry's hashes,
and read the releases back."""

from __future__ import annotations

import logging
from typing import Any

from tasks.board.blobs import upload_blobs
from tasks.board.control import agent_json
from tasks.board.inventory import Board
from tasks.board.transport import Transport
from tasks.errors import TransferError

log = logging.getLogger(__name__)

RELEASE_FILES = ("model.onnx", "model.int8.onnx", "priors.npy")


def install_version(conn: Transport, board: Board, recipe: str, version: Any) -> dict[str, Any]:
    """Upload a version's files as blobs, install them as the board's current release and read
    it back: every file's sha256 on the board must equal the registry's."""
    files = version.verified_files(RELEASE_FILES)  # name -> (path, sha256 as recorded)
    hashes = {name: sha for name, (_, sha) in files.items()}
    upload_blobs(conn, board, {sha: path for path, sha in files.values()})
    args = [f"{name}={sha}" for name, sha in hashes.items()]
    answer = agent_json(conn, board, "install-model", recipe, version.name, *args)
    return checked_install(board, recipe, version.name, hashes, answer)


def checked_install(
    board: Board, recipe: str, version: str, hashes: dict[str, str], answer: dict[str, Any]
) -> dict[str, Any]:
    """The agent's ``install-model`` answer once it shows ``version`` current with ``hashes``
    verified on the board; TransferError otherwise (a hook that failed is only logged)."""
    current = answer.get("current") or {}
    if current.get("version") != version or current.get("files") != hashes or not current.get("verified"):
        raise TransferError(
            f"board {board.name}: models/{recipe}/current is {current.get('version')!r} with files "
            f"{current.get('files')} after installing {version} {hashes}"
        )
    hook = answer.get("hook")
    if hook and hook.get("exit_code") != 0:
        log.warning("board %s: models/%s/on-change failed: %s", board.name, recipe, hook)
    return answer


def board_models(conn: Transport, board: Board, recipe: str) -> dict[str, Any]:
    """The releases the board serves for ``recipe`` (current and previous)."""
    return agent_json(conn, board, "models", recipe)
