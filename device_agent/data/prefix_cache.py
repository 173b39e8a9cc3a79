"""Frozen-prefix caching on the board: the prefix runs once per sample, the suffix trains on its
stored outputs.

:class:`PrefixCache` wraps a dataset of the model's raw inputs and answers ``take`` with the
prefix's output (the suffix's first input) and the other inputs the suffix reads (labels). A row
is computed the first time a batch asks for it (so the first epoch pays for the prefix, later ones
do not) and kept in RAM or in a file under the job folder, as float32 (exact: the suffix sees what
the full graph would compute) or float16 (half the room). The cache lives as long as the process:
a resumed job fills it again from the rows its batches ask for.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from device_agent.data.checks import np_dtype
from device_agent.errors import AgentError
from device_agent.ort import load_onnxruntime, session_options
from device_agent.protocol import ExitCode, PrefixSpec
from device_agent.sysinfo import free_disk_mb, meminfo_mb

log = logging.getLogger(__name__)
RAM_SHARE = 0.5  # "auto" keeps the cache in RAM when it fits this share of the RAM left to the job


def open_prefix(path: Path, spec: PrefixSpec) -> Any:
    """An inference session of the prefix model (the same CPU kernels the training graph uses), its
    worker not spinning between operators, as the training sessions' (it takes turns with them)."""
    ort = load_onnxruntime()
    try:
        sess = ort.InferenceSession(str(path), session_options(ort), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises several exception types
        raise AgentError(ExitCode.ARTIFACT_INVALID, f"prefix.model: does not load: {exc}") from exc
    have = [i.name for i in sess.get_inputs()]
    outs = [o.name for o in sess.get_outputs()]
    if sorted(have) != sorted(spec.inputs) or outs != [spec.output]:
        raise AgentError(
            ExitCode.INVALID_SPEC,
            f"prefix: the model reads {have} and writes {outs}; the spec says {list(spec.inputs)} -> {spec.output}",
            "prefix",
        )
    return sess


def column(ds: Any, name: str) -> np.ndarray | None:
    """The whole column ``name`` of a dataset without decoding the others (None if it cannot)."""
    arrays = getattr(ds, "arrays", None)
    if arrays is not None and name in arrays:
        return arrays[name]
    shards = getattr(ds, "shards", None)
    if shards:
        return np.concatenate([s.arrays[name] for s in shards])
    names = getattr(ds, "names", [])
    if len(names) > 1 and names[1] == name and hasattr(ds, "labels"):
        return ds.labels
    return None


class PrefixCache:
    """A dataset of (prefix output, passthrough inputs) over a dataset of raw inputs."""

    def __init__(self, raw: Any, sess: Any, spec: PrefixSpec, rest: list[str], *, batch: int,
                 budget_mb: float, spill: Path, events: Any = None, field: str = "train_data") -> None:  # fmt: skip
        self.raw, self.sess, self.spec, self.batch = raw, sess, spec, batch
        self.budget_mb, self.spill, self.events, self.field = budget_mb, spill, events, field
        self.rest = {name: column(raw, name) for name in rest}
        self.in_dtypes = {i.name: np_dtype(i.type) for i in sess.get_inputs()}
        self.done = np.zeros(len(raw), dtype=bool)
        self.cached = 0  # rows computed; when all are, take skips its check (~1 % of a small step)
        self.missing = [name for name, col in self.rest.items() if col is None]
        self.feats: np.ndarray | None = None
        self.store = ""
        self.prefix_s = 0.0

    def __len__(self) -> int:
        return len(self.raw)

    @property
    def labels(self) -> Any:
        return getattr(self.raw, "labels", None)

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The prefix output and passthrough inputs of rows ``idx`` (computing missing rows)."""
        if self.cached < len(self.done):
            done = self.done[idx] if self.feats is not None else None
            if done is None or not done.all():
                todo = np.unique(idx if done is None else idx[~done])
                self._fill(todo)
                self.cached += len(todo)
        out = {self.spec.output: self.feats[idx]}  # type: ignore[index]
        if self.missing:
            rows = self.raw.take(idx)
            out.update({n: rows[n] for n in self.missing})
        out.update({n: col[idx] for n, col in self.rest.items() if col is not None})
        return out

    def _fill(self, rows: np.ndarray) -> None:
        t0 = time.perf_counter()
        for start in range(0, len(rows), self.batch):
            part = rows[start : start + self.batch]
            raw = self.raw.take(part)
            feeds = {n: np.ascontiguousarray(raw[n], dtype=self.in_dtypes[n]) for n in self.spec.inputs}
            (out,) = self.sess.run([self.spec.output], feeds)
            if self.feats is None:
                self._allocate(out.shape[1:])
            self.feats[part] = out  # type: ignore[index]
            self.done[part] = True
        self.prefix_s += time.perf_counter() - t0

    def _allocate(self, shape: tuple[int, ...]) -> None:
        dtype = np.dtype(self.spec.dtype)
        full = (len(self.raw), *shape)
        mb = math.prod(full) * dtype.itemsize / 2**20
        store = self.spec.store
        if store == "auto":
            store = "ram" if mb <= self.budget_mb else "disk"
        if store == "ram":
            avail = meminfo_mb()["available_mb"]
            if mb > avail:
                raise AgentError(
                    ExitCode.NO_MEMORY,
                    f"prefix cache of {self.field}: {mb:.0f} MB does not fit the {avail:.0f} MB of free RAM "
                    "(set training.cache_store = 'disk' or cache_dtype = 'float16')",
                    "prefix.store",
                )
            self.feats = np.empty(full, dtype=dtype)
        else:
            free = free_disk_mb(self.spill.parent)
            if mb + 16 > free:
                raise AgentError(
                    ExitCode.NO_DISK,
                    f"prefix cache of {self.field}: {mb:.0f} MB does not fit the {free:.0f} MB free under {self.spill.parent}",
                    "prefix.store",
                )
            self.feats = np.lib.format.open_memmap(self.spill, mode="w+", dtype=dtype, shape=full)
        self.store = store
        log.info("prefix cache of %s: %s %s in %s (%.1f MB)", self.field, dtype, list(full), store, mb)
        if self.events is not None:
            self.events.emit("cache", field=self.field, store=store, dtype=str(dtype),
                             shape=list(full), mb=round(mb, 2))  # fmt: skip
