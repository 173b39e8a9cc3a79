"""Content-addressed file contents in the shared store: a blob is named by its sha256.

:class:`BlobStore` is the whole interface the registry uses (``put`` a file, ask whether a hash is
``present``, ``fetch`` one into a local file, verified). :class:`PgBlobStore` keeps blobs in
PostgreSQL: table ``odl_blobs`` (hash, size, chunk count) and ``odl_blob_chunks`` (the bytes, in
``CHUNK`` pieces of bytea), both written in one transaction, so a blob is either whole or absent.
The registry commits a version's blobs BEFORE the version row that names them (a foreign key
enforces it), so no reader meets a version whose files are missing. Another backend (an S3-compatible
object store, keyed ``sha256/<hash>``, written whole then named) can replace this class without the
registry changing, as long as it keeps those two promises: a hash is present only when whole, and
what ``fetch`` returns is verified against the hash.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Protocol

from tasks.errors import StoreError
from tasks.hashing import file_sha256
from tasks.store.connection import Store

CHUNK = 1 << 20  # bytes per row of odl_blob_chunks: bounded memory for both writer and reader


class BlobStore(Protocol):
    """Where the registry keeps file contents, addressed by their sha256."""

    def put(self, path: Path) -> str:
        """Store the file at ``path`` (once per content); its sha256."""
        ...

    def present(self, hashes: set[str]) -> set[str]:
        """Those of ``hashes`` the store holds whole."""
        ...

    def fetch(self, sha256: str, dest: Path) -> Path:
        """Write blob ``sha256`` to ``dest`` (atomically) after checking its hash; StoreError if it differs."""
        ...


class PgBlobStore:
    """Blobs in PostgreSQL (bytea in chunks); see the module docstring."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def put(self, path: Path) -> str:
        sha = file_sha256(path)
        size = path.stat().st_size
        chunks = max(1, -(-size // CHUNK))
        with self.store.transaction() as conn:
            if conn.execute("SELECT 1 FROM odl_blobs WHERE sha256 = %s", (sha,)).fetchone():
                return sha
            # a concurrent writer of the same content waits on this row, then finds it written
            done = conn.execute(
                "INSERT INTO odl_blobs (sha256, size, chunks) VALUES (%s, %s, %s) "
                "ON CONFLICT (sha256) DO NOTHING RETURNING sha256",
                (sha, size, chunks),
            ).fetchone()
            if done is None:
                return sha
            with open(path, "rb") as f:
                for idx in range(chunks):
                    conn.execute(
                        "INSERT INTO odl_blob_chunks (sha256, idx, data) VALUES (%s, %s, %s)",
                        (sha, idx, f.read(CHUNK)),
                    )
        return sha

    def present(self, hashes: set[str]) -> set[str]:
        if not hashes:
            return set()
        with self.store.transaction() as conn:
            rows = conn.execute("SELECT sha256 FROM odl_blobs WHERE sha256 = ANY(%s)", (sorted(hashes),))
            return {r[0] for r in rows}

    def fetch(self, sha256: str, dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, self.store.transaction() as conn:
                row = conn.execute("SELECT chunks FROM odl_blobs WHERE sha256 = %s", (sha256,)).fetchone()
                if row is None:
                    raise StoreError(f"{self.store.cfg.url}: blob {sha256[:12]} is not in the store")
                for idx in range(row[0]):  # one row at a time: memory stays at one chunk
                    part = conn.execute(
                        "SELECT data FROM odl_blob_chunks WHERE sha256 = %s AND idx = %s", (sha256, idx)
                    ).fetchone()
                    data = bytes(part[0]) if part else b""
                    digest.update(data)
                    out.write(data)
            if digest.hexdigest() != sha256:
                raise StoreError(
                    f"{self.store.cfg.url}: blob {sha256[:12]} reads back as {digest.hexdigest()[:12]}; "
                    "the store's copy is damaged: record the version again"
                )
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return dest
