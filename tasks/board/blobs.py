"""Content-addressed upload of artifacts and data to a board's ``ROOT/blobs/<sha256>``.

A blob the board already has (same sha256 and size) is skipped; a new one is written under a
temporary name, then the agent's ``put-blob`` verifies its hash on the board and renames it: a
half-written file is never used. The listing is the agent's ``blobs`` command, which also removes
uploads a dropped link left behind. Both need the agent installed (``install_agent`` first).
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device_agent.protocol import BLOBS_DIR, BlobListing, ExitCode, SpecError, blob_tmp_name, valid_blob_name
from tasks.board.agent import agent_argv, last_json_line
from tasks.board.inventory import Board
from tasks.board.transport import ByteProgress, Transport
from tasks.errors import (
    DeviceError,
    DeviceIncompatible,
    DeviceUnreachable,
    InvalidJob,
    RemoteCommandFailed,
    TransferError,
    should_retry,
)

log = logging.getLogger(__name__)

DISK_MARGIN = 16 * 2**20  # bytes kept free on the board beyond the blobs (job files, checkpoints)


@dataclass
class UploadReport:
    """What an upload sent: bytes on the wire, blobs skipped (already there) and uploaded."""

    bytes_sent: int = 0
    skipped: list[str] = field(default_factory=list)
    uploaded: list[str] = field(default_factory=list)


@dataclass
class Delivered:
    """What delivering a job's files did: the agent's ``info`` and the blobs sent or already there
    (for a pull-mode board: queued in the host's mailbox for it to fetch)."""

    info: Any
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_sent: int = 0


def upload_blobs(
    conn: Transport,
    board: Board,
    files: dict[str, Path],
    progress: ByteProgress | None = None,
    retries: int = 3,
) -> UploadReport:
    """Upload the blobs the board lacks (by sha256 + size), verified on the board, renamed atomically."""
    for sha in files:
        try:
            valid_blob_name(sha)
        except SpecError as exc:
            raise InvalidJob(f"blob name {sha!r} refused: {exc}") from exc
    blobs = posixpath.join(board.root, BLOBS_DIR)
    listing = board_blobs(conn, board)
    have, free = listing.blobs, listing.free
    report = UploadReport()
    total = sum(Path(p).stat().st_size for sha, p in files.items() if have.get(sha) != Path(p).stat().st_size)
    if total + DISK_MARGIN > free:
        raise DeviceIncompatible(
            f"board {board.name}: not enough disk space under {blobs}: {total / 2**20:.1f} MB to upload "
            f"(+{DISK_MARGIN / 2**20:.0f} MB margin), {free / 2**20:.1f} MB free"
        )
    for sha, path in sorted(files.items()):
        size = Path(path).stat().st_size
        if have.get(sha) == size:
            report.skipped.append(sha)
            continue
        _upload_one(
            conn, board, sha, Path(path), retries, _offset_progress(progress, report.bytes_sent, total)
        )
        report.bytes_sent += size
        report.uploaded.append(sha)
    log.info(
        "board %s: uploaded %d blob(s), %d bytes; %d already there",
        board.name,
        len(report.uploaded),
        report.bytes_sent,
        len(report.skipped),
    )
    return report


def _offset_progress(progress: ByteProgress | None, base: int, total: int) -> ByteProgress | None:
    if progress is None:
        return None
    return lambda done, _size: progress(base + done, total)


def board_blobs(conn: Transport, board: Board) -> BlobListing:
    """The agent's ``blobs`` answer: what ``ROOT/blobs`` holds and the free bytes there."""
    argv = agent_argv(board, "blobs")
    res = conn.run(argv)
    try:
        return BlobListing.from_dict(last_json_line(res.stdout))
    except SpecError as exc:
        raise RemoteCommandFailed(argv, res.code, f"unreadable answer ({exc}): {res.stdout}") from exc


def _upload_one(
    conn: Transport, board: Board, sha: str, path: Path, retries: int, progress: ByteProgress | None
) -> None:
    """Upload one blob; a retryable failure (transfer, hash mismatch) is tried again on this link."""
    blobs = posixpath.join(board.root, BLOBS_DIR)
    for attempt in range(1, retries + 1):
        tmp = posixpath.join(blobs, blob_tmp_name(sha, secrets.token_hex(4)))
        try:
            conn.put(path, tmp, progress)
            _put_blob(conn, board, tmp, sha, path)
            return
        except DeviceError as exc:
            with contextlib.suppress(DeviceError):  # the link may be gone: 'blobs' cleans up later
                conn.run(["rm", "-f", tmp], check=False)
            if "No space left" in str(exc):
                raise DeviceIncompatible(
                    f"board {board.name}: disk full (no space left on device) under {blobs} "
                    f"while uploading {path.name}; the partial blob was removed"
                ) from exc
            if isinstance(exc, DeviceUnreachable) or not should_retry(exc):
                raise  # an unreachable board is retried by the caller, on a new connection
            err = exc
        log.warning("upload of %s failed (attempt %d/%d): %s", path.name, attempt, retries, err)
    raise err


def _put_blob(conn: Transport, board: Board, tmp: str, sha: str, path: Path) -> None:
    """The agent's ``put-blob``: TransferError when the upload's hash is not ``sha``."""
    argv = agent_argv(board, "put-blob", tmp, sha)
    res = conn.run(argv, check=False)
    if res.code == ExitCode.BLOB_MISMATCH:
        raise TransferError(f"board {board.name}: blob {sha[:12]} ({path.name}) hash mismatch after upload")
    if res.code != 0:
        raise RemoteCommandFailed(argv, res.code, res.stderr or res.stdout)
