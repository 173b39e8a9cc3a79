"""Datasets on the board: ``.npz`` (memory-mapped when stored uncompressed) and image folders.

A dataset is a mapping of model input name -> array-like with a common first axis; ``take``
returns one batch. The shuffle of epoch ``e`` depends only on ``(seed, e)``, so a resumed job
sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device_agent.errors import AgentError
from device_agent.protocol import ExitCode

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, shape (ints or None for symbolic dims), numpy dtype and the symbolic
    dims' names as the graph gives them (``""`` for a size or an unnamed dim; may be empty)."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype
    symbols: tuple[str, ...] = ()

    @classmethod
    def of(cls, name: str, dims: Any, dtype: np.dtype) -> InputSpec:
        """From a graph's dims: ints, and a name (str) or None for each symbolic one."""
        dims = tuple(dims)
        shape = tuple(d if isinstance(d, int) and d > 0 else None for d in dims)
        return cls(name, shape, dtype, tuple(d if isinstance(d, str) else "" for d in dims))

    def shape_text(self) -> str:
        """The shape as a message shows it: ``N`` for the batch and every dim named as the batch is
        (they take its size), a size as its number, another symbolic dim by its name (``?`` when it
        has none): ``(N, 4, height)``, never a second ``N`` that is not the batch."""
        names = self.symbols + ("",) * (len(self.shape) - len(self.symbols))
        batch = names[0] if names else ""
        words = []
        for k, (size, name) in enumerate(zip(self.shape, names, strict=True)):
            if size is not None:
                words.append(str(size))
            elif k == 0 or (batch and name == batch):
                words.append("N")
            else:
                words.append(name if name and not re.fullmatch(r"unk__\d+", name) else "?")
        return "(" + ", ".join(words) + ")"


def load_npz_arrays(path: Path, field: str) -> dict[str, np.ndarray]:
    """All arrays of an .npz; members stored uncompressed are memory-mapped, others read."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise AgentError(
            ExitCode.DATA_MISMATCH, f"{field}: {path} is not an .npz file ({exc})", field
        ) from exc
    arrays = {}
    with zf, open(path, "rb") as raw:
        for info in zf.infolist():
            key = info.filename.removesuffix(".npy")
            if info.compress_type == zipfile.ZIP_STORED:
                arrays[key] = _memmap_member(path, raw, info)
            else:
                with zf.open(info) as member:
                    arrays[key] = np.lib.format.read_array(member, allow_pickle=False)
    return arrays


def _memmap_member(path: Path, raw: Any, info: zipfile.ZipInfo) -> np.ndarray:
    raw.seek(info.header_offset + 26)
    name_len, extra_len = np.frombuffer(raw.read(4), dtype="<u2")
    start = info.header_offset + 30 + int(name_len) + int(extra_len)
    raw.seek(start)
    version = np.lib.format.read_magic(raw)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = reader(raw)
    if dtype.hasobject:
        raise AgentError(ExitCode.DATA_MISMATCH, f"{path}: array {info.filename} holds Python objects")
    order = "F" if fortran else "C"
    mapped = np.memmap(path, dtype=dtype, mode="r", offset=raw.tell(), shape=shape, order=order)
    return np.asarray(mapped)  # a plain ndarray view of the mapping: cheaper to index than np.memmap


class NpzDataset:
    """Arrays of an .npz bound to model inputs through ``feeds`` (input name -> npz key)."""

    def __init__(self, path: Path, inputs: list[str], feeds: dict[str, str], field: str) -> None:
        arrays = load_npz_arrays(path, field)
        mapping = feeds or dict(zip(inputs, ("x", "y"), strict=False))
        missing_inputs = [n for n in inputs if n not in mapping]
        if missing_inputs:
            raise AgentError(
                ExitCode.INVALID_SPEC,
                f"feeds: model input {missing_inputs[0]!r} has no npz key (inputs: {inputs})",
                "feeds",
            )
        self.arrays: dict[str, Any] = {}
        for name in inputs:
            key = mapping[name]
            if key not in arrays:
                raise AgentError(
                    ExitCode.DATA_MISMATCH,
                    f"{field}: npz has no array {key!r} for model input {name!r} (has {sorted(arrays)})",
                    field,
                )
            self.arrays[name] = arrays[key]
        self.field = field

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The rows ``idx`` of every input."""
        return {k: v[idx] for k, v in self.arrays.items()}


class ImageFolderDataset:
    """Class subfolders of images -> (image CHW float32 in [0,1], label int64), decoded lazily."""

    def __init__(
        self,
        path: Path,
        inputs: list[InputSpec],
        field: str,
        files: list[Path] | None = None,
        classes: tuple[str, ...] | None = None,
    ) -> None:
        try:
            from PIL import Image  # noqa: F401  # lazy: optional (image folders only), a clear error without it
        except ImportError as exc:
            raise AgentError(
                ExitCode.ENVIRONMENT,
                f"{field}: image-folder datasets need Pillow, not installed on this board",
                field,
            ) from exc
        classes = classes or tuple(sorted(p.name for p in Path(path).iterdir() if p.is_dir()))
        if files is None:
            files = [f for c in classes for f in sorted((Path(path) / c).iterdir())]
        label = {c: i for i, c in enumerate(classes)}
        self.files: list[tuple[Path, int]] = [
            (f, label[f.parent.name])
            for f in files
            if f.suffix.lower() in IMAGE_SUFFIXES and f.parent.name in label
        ]
        if not self.files:
            raise AgentError(
                ExitCode.DATA_MISMATCH, f"{field}: no images in class subfolders of {path}", field
            )
        self.names = [inputs[0].name, inputs[1].name] if len(inputs) > 1 else [inputs[0].name]
        channels, height, width = (inputs[0].shape[1:] + (None, None, None))[:3]
        self.size = (width or 224, height or 224)
        self.mode = "L" if channels == 1 else "RGB"
        self.field = field

    def __len__(self) -> int:
        return len(self.files)

    @property
    def labels(self) -> np.ndarray:
        """The class index of every image (folder order, sorted by name)."""
        return np.asarray([label for _, label in self.files], dtype=np.int64)

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Decode, resize and stack the images ``idx``."""
        from PIL import Image  # lazy: optional, checked in __init__

        imgs, labels = [], []
        for i in idx:
            path, label = self.files[int(i)]
            with Image.open(path) as im:
                arr = np.asarray(im.convert(self.mode).resize(self.size), dtype=np.float32) / 255.0
            imgs.append(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1))
            labels.append(label)
        out = {self.names[0]: np.stack(imgs)}
        if len(self.names) > 1:
            out[self.names[1]] = np.asarray(labels, dtype=np.int64)
        return out


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The shuffle of epoch ``epoch``: a function of (seed, epoch) only."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n)


def steps_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
    """Batches per epoch."""
    return n // batch_size if drop_last else -(-n // batch_size)
