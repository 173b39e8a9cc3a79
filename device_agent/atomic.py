"""Files written whole or not at all: a temporary name, fsync, rename, then the folder fsync'd, so a
reader (or a board after a power loss) sees the old content or the new one, never half of it. Job
folders, checkpoints, blobs, dataset folders, model releases and teacher labels are written so."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def atomic_write(path: Path, text: str) -> None:
    """Write a file via tmp + fsync + rename, so readers see the old or the new content only."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_savez(path: Path, arrays: dict[str, Any]) -> None:
    """``np.savez`` of ``arrays`` to ``path`` via a temporary file of this process + fsync + rename."""
    import numpy as np  # lazy: the light commands (through jobdir) load no numpy

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
