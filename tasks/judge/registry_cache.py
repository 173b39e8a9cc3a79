"""A shared registry version's files on this host: fetched by hash from the store on first use.

A version of the shared registry (:mod:`tasks.judge.registry_shared`) names its files by sha256; its
folder on this host is ``$ODL_HOME/registry-cache/<store>/<recipe>-<board>/vNNNN/``, laid out like a
local version (``model.onnx``, its side files, ``metrics.json``, ``info.json``) so every reader of a
version folder works unchanged. Each file is fetched by hash (verified, renamed into place whole);
``.complete`` (the digest of the name -> sha256 list) is written last, so a folder without it, or
with another list, is checked again file by file and fetched where a hash differs. The store is the one of this host's environment at the time of the fetch: nothing of it
(no URL, no password) is kept in a :class:`~tasks.judge.registry_base.Version`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tasks.errors import RegistryError
from tasks.hashing import file_sha256
from tasks.paths import odl_home
from tasks.store import PgBlobStore, StoreConfig, configured_store

COMPLETE = ".complete"


def cache_root(cfg: StoreConfig, home: Path | None = None) -> Path:
    """The cache folder of the versions of store ``cfg`` on this host (one per store, by its URL)."""
    return (home or odl_home()) / "registry-cache" / hashlib.sha256(cfg.url.encode()).hexdigest()[:16]


def write_json(path: Path, data: Any) -> None:
    """``data`` as the registry writes JSON (sorted, indented), via a temporary file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    tmp.replace(path)


def materialize(folder: Path, files: dict[str, str], info: dict[str, Any], metrics: dict[str, Any]) -> Path:
    """Make ``folder`` hold the version's ``files`` (name -> sha256, each verified) and its JSON files."""
    stamp = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    done = folder / COMPLETE
    if done.is_file() and done.read_text() == stamp:  # laid and verified before, for these very files
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    missing = {
        n: sha for n, sha in files.items() if not (folder / n).is_file() or file_sha256(folder / n) != sha
    }
    if missing:
        store = configured_store()
        if store is None:
            raise RegistryError(
                f"{folder}: the version's files are in the shared store, and ODL_STORE_URL is not set here"
            )
        blobs = PgBlobStore(store)
        for name, sha in sorted(missing.items()):
            blobs.fetch(sha, folder / name)
    write_json(folder / "metrics.json", metrics)
    write_json(folder / "info.json", info)
    done.write_text(stamp)
    return folder
