"""``ROOT/blobs/<sha256>``: the board's content-addressed store, listed and filled by the agent.

The host copies a new blob to ``blobs/.tmp-<sha256>-<hex>`` and then runs ``put-blob``, which
hashes it with the agent's one hashing function (:func:`~device_agent.protocol.file_sha256`, the
one that verifies a job's blobs before training), makes it read-only and renames it into place:
a half-written or corrupt upload never shows under a blob's name. ``blobs`` lists the store and
removes the temporary files of uploads a dropped link cut off (untouched for ``STALE_TMP_S``).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from device_agent.atomic import fsync_dir
from device_agent.errors import AgentError
from device_agent.protocol import (
    BLOB_TMP_PREFIX,
    BLOB_TMP_RE,
    BLOBS_DIR,
    SHA256_RE,
    STALE_TMP_S,
    BlobListing,
    BlobRef,
    ExitCode,
    SpecError,
    file_sha256,
    valid_blob_name,
)


def blob_store(root: Path) -> Path:
    """``root/blobs``, created when missing; a symbolic link there is refused (never followed)."""
    store = root / BLOBS_DIR
    if store.is_symlink():
        raise AgentError(ExitCode.INVALID_ARGUMENT, f"{store} is a symbolic link; refusing to use it")
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AgentError(ExitCode.ENVIRONMENT, f"cannot create {store}: {exc}") from exc
    return store


def list_blobs(root: Path) -> BlobListing:
    """The blobs under ``root/blobs`` with their sizes and the free bytes there; removes stale uploads."""
    store = blob_store(root)
    cutoff = time.time() - STALE_TMP_S
    for entry in os.scandir(store):
        if entry.name.startswith(BLOB_TMP_PREFIX) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
            Path(entry.path).unlink(missing_ok=True)
    have = {
        e.name: e.stat(follow_symlinks=False).st_size
        for e in os.scandir(store)
        if SHA256_RE.match(e.name) and e.is_file(follow_symlinks=False)
    }
    st = os.statvfs(store)
    return BlobListing(have, st.f_bavail * st.f_frsize)


def put_blob(root: Path, tmp: str, sha256: str) -> BlobRef:
    """Move the upload ``tmp`` to ``blobs/<sha256>`` once its hash is ``sha256`` (read-only, atomic).

    ``tmp`` must be a regular file named ``.tmp-<sha256>-<hex>`` directly in ``root/blobs``
    (INVALID_ARGUMENT otherwise, nothing touched). A hash mismatch removes it (BLOB_MISMATCH).
    """
    try:
        valid_blob_name(sha256)
    except SpecError as exc:
        raise AgentError(ExitCode.INVALID_ARGUMENT, f"put-blob: {exc}", "sha256") from exc
    store = blob_store(root)
    path = _upload_in(store, tmp)
    try:
        actual = file_sha256(path)
        if actual != sha256:
            raise AgentError(
                ExitCode.BLOB_MISMATCH, f"blob {sha256}: the upload hashes to {actual}; removed", "sha256"
            )
        os.chmod(path, 0o444)
        size = path.stat().st_size
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(path, store / sha256)
        fsync_dir(store)
    except OSError as exc:
        raise AgentError(ExitCode.ENVIRONMENT, f"blob {sha256}: {exc}") from exc
    finally:
        path.unlink(missing_ok=True)  # after a mismatch or an error; already gone once renamed
    return BlobRef(sha256, size)


def _upload_in(store: Path, tmp: str) -> Path:
    """``tmp`` as a path after checking it is an upload's regular file directly in ``store``."""
    path = Path(tmp).expanduser()
    inside = BLOB_TMP_RE.match(path.name) is not None and path.parent.resolve() == store.resolve()
    try:
        regular = stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        regular = False
    if not (inside and regular):
        raise AgentError(
            ExitCode.INVALID_ARGUMENT,
            f"put-blob: {tmp!r} is not an upload (a regular file named {BLOB_TMP_PREFIX}<sha256>-<hex>) "
            f"directly in {store}",
            "tmp",
        )
    return store / path.name
