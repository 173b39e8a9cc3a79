"""Prepared folders shared between hosts, content-addressed (issue 45): a host that lacks the folder
of a job's inputs fetches it from the shared store instead of preparing the recipe again.

One interface, :class:`PreparedStore`, two places behind it (:func:`prepared_store` picks):

- :class:`LocalPrepared` (no ``ODL_STORE_URL``, the embedded default): nothing is shared, each host
  prepares in its own ``$ODL_HOME/prepared``;
- :class:`StorePrepared`: the folder of inputs key K (the sha256 over the recipe, its files and the
  preparation code: :class:`tasks.prepare.pipeline.Inputs`) is document ``prepared/K`` of the store,
  listing the steps done (``.done-<step>`` markers holding K) and each file's sha256; the files are
  blobs (:class:`tasks.store.PgBlobStore`).

Atomic both ways. **Publishing** puts every file's blob first, each committed whole, and only then
writes the listing (one row): a folder half uploaded, or whose host was cut off mid-way, is absent
for every other host (its whole blobs wait, unnamed, for the next try). A listing is replaced only
by one with more steps, so two hosts publishing the same key at once keep one consistent set.
**Fetching** writes the listed files, each verified against its sha256, into a temporary sibling of
the folder that replaces it only when all are there (:func:`tasks.prepare.staging.staged`): a fetch
that fails leaves the host as it was. A folder is always one host's whole set of files, never a mix.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol

from tasks.prepare.staging import staged
from tasks.store import Documents, PgBlobStore, Store, configured_store

log = logging.getLogger(__name__)

PREFIX = "prepared/"  # the listing of inputs key K is the store's document prepared/K
STEPS = ("export", "artifacts", "validate")


class PreparedStore(Protocol):
    """Where prepared folders are shared (or not) between hosts."""

    def fetch(self, folder: Path, key: str, step: str) -> bool:
        """Make ``folder`` the shared folder of inputs ``key`` when one with ``step`` done is shared;
        whether it did."""
        ...

    def publish(self, folder: Path, key: str) -> None:
        """Share ``folder`` (prepared for inputs ``key``) with the other hosts."""
        ...


class LocalPrepared:
    """No store: each host prepares for itself."""

    def fetch(self, folder: Path, key: str, step: str) -> bool:
        return False

    def publish(self, folder: Path, key: str) -> None:
        return None


def done_steps(folder: Path, key: str) -> list[str]:
    """The steps whose marker in ``folder`` holds ``key``, in order."""
    out = []
    for step in STEPS:
        marker = folder / f".done-{step}"
        if marker.is_file() and marker.read_text().strip() == key:
            out.append(step)
    return out


def folder_files(folder: Path) -> dict[str, Path]:
    """The files a prepared folder is made of, by path relative to it: every file but hidden ones
    (a writer's temporary files), the steps' markers included."""
    files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        hidden = any(p.startswith(".") for p in rel.parts) and not rel.name.startswith(".done-")
        if path.is_file() and not path.is_symlink() and not hidden:
            files[rel.as_posix()] = path
    return files


class StorePrepared:
    """Prepared folders in the shared store ``store`` (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self.blobs = PgBlobStore(store)
        self.docs = Documents(store)

    def listing(self, key: str) -> dict | None:
        """The shared listing of inputs ``key`` ({"steps", "files": rel -> sha256}), None if none."""
        content = self.docs.get(PREFIX + key).content
        return json.loads(content) if content is not None else None

    def fetch(self, folder: Path, key: str, step: str) -> bool:
        listing = self.listing(key)
        if listing is None or step not in listing["steps"]:
            return False
        files = listing["files"]
        with staged(folder, own=True) as work:
            for rel, sha in sorted(files.items()):
                self.blobs.fetch(sha, work / rel)  # verified against its sha256, else StoreError
        size = sum(p.stat().st_size for p in folder_files(folder).values())
        log.info("prepared %s: fetched from the shared store (%d files, %d bytes; %s done there), not prepared "
                 "here", folder.name, len(files), size, ", ".join(listing["steps"]))  # fmt: skip
        return True

    def publish(self, folder: Path, key: str) -> None:
        steps = done_steps(folder, key)
        if not steps:
            return
        shared = self.listing(key)
        if shared is not None and set(steps) <= set(shared["steps"]):
            return  # the store has as much already (another host's, or this one's before)
        files = {rel: self.blobs.put(path) for rel, path in folder_files(folder).items()}  # each whole
        content = json.dumps({"key": key, "steps": steps, "files": files}, sort_keys=True).encode()
        with self.docs.update(PREFIX + key) as doc:  # named only now: after every blob it lists
            old = json.loads(doc.content) if doc.content is not None else {"steps": []}
            if not set(steps) <= set(old["steps"]):
                doc.content = content
        log.info(
            "prepared %s: shared in the store (%d files; %s done)", folder.name, len(files), ", ".join(steps)
        )


def prepared_store() -> PreparedStore:
    """The shared store's when ``ODL_STORE_URL`` is set, else the local default (nothing shared)."""
    store = configured_store()
    return StorePrepared(store) if store is not None else LocalPrepared()
