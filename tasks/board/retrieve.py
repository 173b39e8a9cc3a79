"""Retrieval of a finished job's outputs from the board, verified against ``result.json``.

Downloads ``inference.onnx``, the final checkpoint and every other output listed in the result
(each checked against its sha256; a mismatch removes the partial file and raises TransferError),
plus ``result.json``, ``events.jsonl`` and ``agent.log`` as they are.
"""

from __future__ import annotations

import logging
import os
import posixpath
from pathlib import Path

from device_agent.protocol import JobResult
from tasks.board.inventory import Board
from tasks.board.jobs import job_dir
from tasks.board.transport import ByteProgress, Transport, connect
from tasks.errors import DeviceError, TransferError
from tasks.hashing import file_sha256

log = logging.getLogger(__name__)

PLAIN_FILES = ("result.json", "events.jsonl", "agent.log")


def retrieve(
    conn_or_board: Transport | Board,
    job_id: str,
    result: JobResult,
    out_dir: Path,
    board: Board | None = None,
    progress: ByteProgress | None = None,
    only: tuple[str, ...] | None = None,
) -> dict[str, Path]:
    """Download the job's outputs into ``out_dir``; returns {output name: local path}.

    Pass a Board (a connection is opened and closed here), or an open transport plus ``board``.
    ``only`` names the outputs to fetch (e.g. ``("trainable",)`` for a fleet round); a name the
    result does not list is a TransferError.
    """
    if isinstance(conn_or_board, Board):
        with connect(conn_or_board) as conn:
            return retrieve(conn, job_id, result, out_dir, conn_or_board, progress, only)
    if board is None:
        raise TypeError("retrieve(conn, ...) needs board= to locate the job directory")
    jdir = job_dir(board, job_id)
    refuse_links(conn_or_board, board, jdir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    missing = [n for n in only or () if n not in result.outputs]
    if missing:
        raise TransferError(
            f"job {job_id}: result.json lists no {missing[0]!r} output (has {sorted(result.outputs)}); "
            "the board's agent may predate it"
        )
    got = {
        name: _fetch_verified(conn_or_board, jdir, ref.path, ref.sha256, out_dir, progress)
        for name, ref in result.outputs.items()
        if only is None or name in only
    }
    for name in PLAIN_FILES:
        if conn_or_board.exists(posixpath.join(jdir, name)):
            got[name] = _fetch(conn_or_board, posixpath.join(jdir, name), out_dir / name)
    log.info("retrieved %d file(s) of job %s into %s", len(got), job_id, out_dir)
    return got


def refuse_links(conn: Transport, board: Board, jdir: str) -> None:
    """Refuse to download from a job folder that is, or holds, a symbolic link (it could point
    anywhere on the board, e.g. agent.log -> /etc/shadow)."""
    res = conn.run(["find", jdir, "-type", "l"], check=False)
    links = res.stdout.splitlines()
    if res.stdout.strip():
        raise DeviceError(
            f"board {board.name}: job folder {jdir} holds symbolic link(s) {', '.join(links[:5])}; "
            "refusing to download through them"
        )


def _fetch_verified(
    conn: Transport, jdir: str, rel: str, sha256: str, out_dir: Path, progress: ByteProgress | None
) -> Path:
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise DeviceError(f"result.json lists output {rel!r}: expected a plain path inside the job folder")
    remote = posixpath.join(jdir, rel)
    local = out_dir / rel
    local.parent.mkdir(parents=True, exist_ok=True)
    _fetch(conn, remote, local, progress)
    got = file_sha256(local)
    if got != sha256:
        local.unlink(missing_ok=True)
        raise TransferError(
            f"download of {rel}: sha256 {got[:12]}... does not match result.json's {sha256[:12]}..."
        )
    return local


def _fetch(conn: Transport, remote: str, local: Path, progress: ByteProgress | None = None) -> Path:
    tmp = local.with_name(f".{local.name}.part")
    try:
        conn.get(remote, tmp, progress)
        os.replace(tmp, local)
    finally:
        tmp.unlink(missing_ok=True)
    return local
