"""``add-file FOLDER NAME``: append one file (read from stdin) to a board dataset folder the way a
board application must: written under a hidden name, then linked into place, so a reader never
sees half a file and an existing file is never rewritten (jobs pin files by sha256).

The folder is a relative path of names under the agent root and the file a name
(:data:`device_agent.names.NAME`): refused before anything is created, whatever the host checked.
Standard library only (the light commands load no numpy).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO

from device_agent.atomic import fsync_dir
from device_agent.errors import AgentError
from device_agent.protocol import NAME, ExitCode, file_sha256

CHUNK = 1 << 20


def _refuse(field: str) -> Any:
    return lambda line: AgentError(ExitCode.INVALID_ARGUMENT, line, field)


def make_folder(root: Path, folder: str) -> Path:
    """``ROOT/<folder>`` created part by part; a symbolic link on the way is refused, never followed."""
    root.mkdir(parents=True, exist_ok=True)
    path = root
    for part in NAME.check_path(folder, "folder", error=_refuse("folder")).split("/"):
        path = path / part
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            why = f"folder: {path} is a symbolic link or not a folder; refusing to write through it"
            raise AgentError(ExitCode.INVALID_ARGUMENT, why, "folder")
        path.mkdir(exist_ok=True)
    return path


def append_file(root: Path, folder: str, name: str, data: BinaryIO) -> dict[str, Any]:
    """Write ``data`` as ``ROOT/<folder>/<name>`` unless a file is there: the same bytes answer
    ``added: false``, other bytes DATA_MISMATCH (a dataset folder only grows)."""
    NAME.check(name, "name", error=_refuse("name"))
    NAME.check_path(folder, "folder", error=_refuse("folder"))  # both refused before any mkdir
    target = make_folder(root, folder)
    tmp = target / f".{name}.{secrets.token_hex(4)}.tmp"
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "xb") as out:
            while block := data.read(CHUNK):
                digest.update(block)
                size += len(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        added = _link(tmp, target / name, digest.hexdigest(), f"{folder}/{name}")
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(target)
    return {"path": f"{folder}/{name}", "sha256": digest.hexdigest(), "size": size, "added": added}


def _link(tmp: Path, dest: Path, sha256: str, shown: str) -> bool:
    """Link ``tmp`` to ``dest`` (never replacing a file); False when ``dest`` has the same bytes."""
    try:
        os.link(tmp, dest)
        return True
    except FileExistsError:
        if dest.is_file() and not dest.is_symlink() and file_sha256(dest) == sha256:
            return False
    raise AgentError(
        ExitCode.DATA_MISMATCH,
        f"{shown} exists with other content; a dataset folder only grows: give the new file another name",
        "name",
    )
