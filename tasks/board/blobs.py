"""Content-addressed upload of artifacts and data to a board's ``ROOT/blobs/<sha256>``.

A blob the board already has (same sha256 and size) is skipped; a new one is written under a
temporary name, its hash verified on the board, then renamed: a half-written file is never used.
"""

from __future__ import annotations

import contextlib
import json
import logging
import posixpath
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from tasks.board.inventory import Board
from tasks.board.transport import ByteProgress, Transport
from tasks.errors import DeviceError, DeviceIncompatible, DeviceUnreachable, TransferError

log = logging.getLogger(__name__)

# Fixed helper programs run by the board's python (arguments are passed as argv, never inlined).
LIST_BLOBS = (
    "import os,sys,json,time\nd=sys.argv[1]\nos.makedirs(d,exist_ok=True)\n"
    "for e in os.scandir(d):\n"  # half uploads of a dropped link, untouched for 10 min: never used, removed
    "    if e.name.startswith('.tmp-') and e.stat().st_mtime<time.time()-600: os.unlink(e.path)\n"
    "have={e.name:e.stat().st_size for e in os.scandir(d) if e.is_file() and len(e.name)==64}\n"
    "st=os.statvfs(d)\nprint(json.dumps({'blobs':have,'free':st.f_bavail*st.f_frsize}))"
)
DISK_MARGIN = 16 * 2**20  # bytes kept free on the board beyond the blobs (job files, checkpoints)
VERIFY_BLOB = (
    "import hashlib,os,sys\ntmp,sha,final=sys.argv[1:4]\nh=hashlib.sha256()\n"
    "with open(tmp,'rb') as f:\n    [h.update(b) for b in iter(lambda: f.read(1<<20), b'')]\n"
    "if h.hexdigest()!=sha:\n    os.unlink(tmp); sys.exit(3)\nos.chmod(tmp,0o444)\nos.replace(tmp,final)"
)


@dataclass
class UploadReport:
    """What an upload sent: bytes on the wire, blobs skipped (already there) and uploaded."""

    bytes_sent: int = 0
    skipped: list[str] = field(default_factory=list)
    uploaded: list[str] = field(default_factory=list)


def upload_blobs(
    conn: Transport,
    board: Board,
    files: dict[str, Path],
    progress: ByteProgress | None = None,
    retries: int = 3,
) -> UploadReport:
    """Upload the blobs the board lacks (by sha256 + size), verified on the board, renamed atomically."""
    blobs = posixpath.join(board.root, "blobs")
    listing = json.loads(conn.run([board.python, "-c", LIST_BLOBS, blobs]).stdout)
    have, free = listing["blobs"], int(listing["free"])
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


def _upload_one(
    conn: Transport, board: Board, sha: str, path: Path, retries: int, progress: ByteProgress | None
) -> None:
    blobs = posixpath.join(board.root, "blobs")
    for attempt in range(1, retries + 1):
        tmp = posixpath.join(blobs, f".tmp-{sha}-{secrets.token_hex(4)}")
        try:
            conn.put(path, tmp, progress)
            res = conn.run(
                [board.python, "-c", VERIFY_BLOB, tmp, sha, posixpath.join(blobs, sha)], check=False
            )
            if res.code == 0:
                return
            err = TransferError(
                f"board {board.name}: blob {sha[:12]} ({path.name}) hash mismatch after upload"
            )
        except (TransferError, DeviceUnreachable) as exc:
            err = exc
            with contextlib.suppress(DeviceError):  # the link may be gone: LIST_BLOBS cleans up later
                conn.run(["rm", "-f", tmp], check=False)
            if isinstance(exc, DeviceUnreachable):
                raise
            if "No space left" in str(exc):
                raise DeviceIncompatible(
                    f"board {board.name}: disk full (no space left on device) under {blobs} "
                    f"while uploading {path.name}; the partial blob was removed"
                ) from exc
        log.warning("upload of %s failed (attempt %d/%d): %s", path.name, attempt, retries, err)
    raise err
