"""Board dataset folders that grow: listing with hashes, verified file sets, sharded npz data.

A board application appends to a folder under the agent root (``ROOT/datasets/<name>`` by
convention): ``.npz`` shards with the same arrays (``npz-shards``; detection shards too, bound by
``feeds``) or images in class subfolders (``image-folder``). It writes each file under a name
starting with ``.`` or ending in ``.tmp``/``.part`` and renames it when complete; such names are
never listed. ``list_dataset`` answers every file with its size, sha256, sample count and arrays (hashes
cached by size and mtime under ``ROOT/cache/datasets``); a job names the exact files it trains on
(``DataRef.files``) and each is verified by sha256 before training.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from device_agent.data.readers import IMAGE_SUFFIXES, ImageFolderDataset, NpzDataset, load_npz_arrays
from device_agent.errors import AgentError
from device_agent.protocol import DataRef, ExitCode, check_board_path, file_sha256

HIDDEN_SUFFIXES = (".tmp", ".part")


def resolve_folder(root: Path, path: str, field: str) -> Path:
    """``path`` (absolute, or a relative path of names under the root) as an existing folder."""
    check_board_path(path, field, error=lambda line: AgentError(ExitCode.INVALID_ARGUMENT, line, field))
    folder = root / path  # an absolute path stays itself
    if not folder.is_dir():
        raise AgentError(ExitCode.DATA_MISMATCH, f"{field}: no dataset folder {folder} on the board", field)
    return folder


def _visible(p: Path) -> bool:
    return not p.name.startswith(".") and not p.name.endswith(HIDDEN_SUFFIXES) and p.is_file()


def dataset_files(folder: Path, fmt: str) -> tuple[list[str], list[str]]:
    """(relative file names, classes): shards sorted by name, or class/image sorted per class."""
    if fmt == "npz-shards":
        return sorted(p.name for p in folder.iterdir() if p.suffix == ".npz" and _visible(p)), []
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    names = [
        f"{c}/{p.name}"
        for c in classes
        for p in sorted((folder / c).iterdir())
        if p.suffix.lower() in IMAGE_SUFFIXES and _visible(p)
    ]
    return names, classes


def _samples(path: Path, fmt: str) -> int:
    if fmt != "npz-shards":
        return 1
    arrays = load_npz_arrays(path, "dataset")
    if not arrays:
        raise AgentError(ExitCode.DATA_MISMATCH, f"dataset: shard {path} holds no arrays", "dataset")
    return int(len(next(iter(arrays.values()))))


def _arrays(path: Path, fmt: str) -> list[str]:
    """The array names of a shard (a shard without labels is one a teacher labels)."""
    return sorted(load_npz_arrays(path, "dataset")) if fmt == "npz-shards" else []


def list_dataset(root: Path, path: str, fmt: str) -> dict[str, Any]:
    """Every visible file of the folder with size, sha256 and samples; classes of an image folder."""
    if fmt not in ("npz-shards", "image-folder"):
        raise AgentError(ExitCode.INVALID_ARGUMENT, f"format: 'npz-shards' or 'image-folder' (got {fmt!r})")
    folder = resolve_folder(root, path, "path")
    cache_file = (
        root / "cache" / "datasets" / (hashlib.sha256(str(folder).encode()).hexdigest()[:24] + ".json")
    )
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    names, classes = dataset_files(folder, fmt)
    files, fresh = [], {}
    for name in names:
        st = (folder / name).stat()
        key = [st.st_size, st.st_mtime_ns]
        hit = cache.get(name)
        if not (isinstance(hit, list) and len(hit) == 5 and hit[:2] == key):
            hit = [
                *key,
                file_sha256(folder / name),
                _samples(folder / name, fmt),
                _arrays(folder / name, fmt),
            ]
        fresh[name] = hit
        files.append({"name": name, "size": hit[0], "sha256": hit[2], "samples": hit[3]}
                     | ({"arrays": hit[4]} if fmt == "npz-shards" else {}))  # fmt: skip
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_file.with_name(cache_file.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(fresh))
    os.replace(tmp, cache_file)
    return {"path": str(folder), "format": fmt, "files": files, "classes": classes,
            "samples": sum(f["samples"] for f in files)}  # fmt: skip


def verify_files(folder: Path, ref: DataRef, field: str) -> list[Path]:
    """The job's files of the folder, each checked for presence, size and sha256."""
    out = []
    for i, f in enumerate(ref.files or ()):
        path = folder / f.name
        where = f"{field}.files[{i}]"
        if not path.is_file():
            raise AgentError(ExitCode.DATA_MISMATCH, f"{where}: {path} is not on the board (removed?)", where)
        if path.stat().st_size != f.size or file_sha256(path) != f.sha256:
            raise AgentError(
                ExitCode.DATA_MISMATCH,
                f"{where}: {path} changed since the job was made (sha256 differs): datasets only grow, "
                "a board application must not rewrite a file it has added",
                where,
            )
        out.append(path)
    return out


class ShardDataset:
    """Several npz shards bound to the same model inputs, read as one dataset (memory-mapped)."""

    def __init__(self, paths: list[Path], inputs: list[str], feeds: dict[str, str], field: str,
                 shards: list[Any] | None = None) -> None:  # fmt: skip
        self.shards = shards or [NpzDataset(p, inputs, feeds, f"{field} ({p.name})") for p in paths]
        first = self.shards[0].arrays
        for shard in self.shards[1:]:
            for name, arr in shard.arrays.items():
                if arr.shape[1:] != first[name].shape[1:] or arr.dtype != first[name].dtype:
                    raise AgentError(
                        ExitCode.DATA_MISMATCH,
                        f"{shard.field}: input {name!r} is {arr.dtype}{list(arr.shape[1:])} per sample, the "
                        f"first shard's is {first[name].dtype}{list(first[name].shape[1:])}",
                        field,
                    )
        self.ends = np.cumsum([len(s) for s in self.shards])
        self.field = field

    def __len__(self) -> int:
        return int(self.ends[-1])

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The rows ``idx`` (global indices) of every input, in the order asked."""
        idx = np.asarray(idx, dtype=np.int64)
        which = np.searchsorted(self.ends, idx, side="right")
        starts = np.concatenate([[0], self.ends[:-1]])
        order = np.argsort(which, kind="stable")
        parts = [self.shards[s].take(idx[order][which[order] == s] - starts[s]) for s in np.unique(which)]
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return {k: np.concatenate([p[k] for p in parts])[back] for k in parts[0]}


def folder_dataset(ref: DataRef, folder: Path, names: list[str], inputs: list, feeds: dict[str, str],
                   field: str) -> Any:  # fmt: skip
    """The dataset of a folder ref: its pinned files (verified), else every file listed now."""
    if ref.files is not None:
        paths = verify_files(folder, ref, field)
    else:
        listed, _ = dataset_files(folder, ref.format)
        paths = [folder / n for n in listed]
    if not paths:
        raise AgentError(ExitCode.DATA_MISMATCH, f"{field}: no files in {folder}", field)
    if ref.format == "npz-shards":
        return ShardDataset(paths, names, feeds, field)
    return ImageFolderDataset(folder, inputs, field, files=paths, classes=ref.classes)
