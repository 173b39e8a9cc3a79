"""Where the mailbox keeps blobs: what a board may fetch and the outputs it sent, by sha256.

Without a shared store they are files of ``$ODL_HOME/pull/blobs/<sha256>``, each written under a
temporary name and renamed once verified. With one they are the store's blobs
(:class:`tasks.store.PgBlobStore`: whole or absent, fetched verified), so a run on any host
submits a job's blobs and fetches its outputs, and the endpoint on another host serves them; the
folder is then this host's cache of verified copies (the endpoint serves a blob from it, with
Range). An output's pieces stay in ``uploads/<job>/<sha>`` on the endpoint's host until complete
and verified: only then does it join the blobs. Either way a blob is only ever served verified.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from device_agent.protocol import file_sha256
from tasks.board.pull.records import Store
from tasks.errors import BoardError


class Blobs(Store):
    """The blobs' part of the mailbox (see the module's docstring)."""

    def add_blob(self, sha: str, path: Path) -> None:
        """Add the file at ``path`` as blob ``sha`` (BoardError when it does not hash to it): a hard
        link (a copy across filesystems), or a put into the shared store."""
        if self.present_blobs({sha}):
            return
        if self.shared_blobs is not None:
            if self.shared_blobs.put(Path(path)) != sha:  # put hashes it as it reads it
                raise BoardError(f"{path}: its sha256 is not {sha}")
            return
        tmp = self.blobs / f".tmp-{sha}-{secrets.token_hex(4)}"
        try:
            os.link(path, tmp)
        except OSError:
            tmp.write_bytes(Path(path).read_bytes())
        if file_sha256(tmp) != sha:
            tmp.unlink()
            raise BoardError(f"{path}: its sha256 is not {sha}")
        os.replace(tmp, self.blobs / sha)

    def present_blobs(self, hashes: set[str]) -> set[str]:
        """Those of ``hashes`` the mailbox holds whole."""
        if self.shared_blobs is not None:
            return self.shared_blobs.present(hashes)
        return {sha for sha in hashes if (self.blobs / sha).exists()}

    def blob_file(self, sha: str) -> Path | None:
        """A verified file of blob ``sha`` on this host (from the shared store into the cache on
        first use), None when the mailbox does not hold it."""
        path = self.blobs / sha
        if path.exists():
            return path
        if self.shared_blobs is None or not self.shared_blobs.present({sha}):
            return None
        return self.shared_blobs.fetch(sha, path)  # verified, written whole under its name

    def keep_blob(self, sha: str, path: Path) -> None:
        """A verified file (an output's completed upload) becomes blob ``sha``: into the shared
        store first, when there is one, then renamed into the folder."""
        if self.shared_blobs is not None:
            self.shared_blobs.put(path)
        os.replace(path, self.blobs / sha)
