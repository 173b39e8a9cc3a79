"""``JOBDIR/batch``: what a job's training process is running now, written before each step, so that
when the process dies of a signal (ONNX Runtime's SIGFPE on an integer division by zero, a SIGSEGV)
its supervisor can say at which step and on which samples.

One record: the phase (``open`` while the job loads, ``train`` for a step, ``eval`` for a batch of
the eval set, ``finish`` while it exports), the step (1-based: the step being trained, or the last
trained during eval and finish), the epoch (1-based), the batch's size and its first ``keep`` dataset
indices, packed in native int64 (``HEADER`` then the indices: the file is this machine's only). It is
written with one ``pwrite`` at offset 0 of a descriptor kept open: no rename, no fsync, no text
formatting (in a digits job on this project's loaded 2-core machine, a mark took 13.5 us a step in
situ, 3 us alone, against a 2 ms step; a text line of its 32 indices took 28 us in situ); the record
says its own length, so a shorter one over a longer one reads whole. A process killed keeps its
written bytes (the page cache is the kernel's); a power cut may lose them, and then nothing is
reported anyway.

The training probe of the host's validation (``tasks.prepare.validation.ort_probe``) marks its
batches with the same writer, and its parent reads them with :func:`read_mark`.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEEP_ROWS = 64  # the indices a job's mark keeps (the result's line shows fewer)
HEADER = struct.Struct("=8sqqqq")  # phase, step, epoch, size, the indices that follow


@dataclass(frozen=True)
class BatchMark:
    """One mark: where the process was when it last wrote one."""

    phase: str
    step: int
    epoch: int
    size: int  # the batch's samples (``rows`` may hold fewer: the first ``keep``)
    rows: tuple[int, ...]

    def same_place(self, other: BatchMark | None) -> bool:
        """The same phase, step and epoch: a process that died twice there died of that step."""
        return other is not None and self._place == other._place

    @property
    def _place(self) -> tuple[str, int, int]:
        return self.phase, self.step, self.epoch

    def samples(self, dataset: str, shown: int = 16) -> str:
        """``samples [3, 40, ...] of train_data (16 in the batch)``: its first ``shown`` dataset indices."""
        listed = ", ".join(map(str, self.rows[:shown])) + (
            ", ..." if self.size > min(shown, len(self.rows)) else ""
        )
        return f"samples [{listed}] of {dataset} ({self.size} in the batch)"

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "step": self.step, "epoch": self.epoch, "size": self.size,
                "rows": list(self.rows)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchMark | None:
        """The mark an event recorded (None when it holds none or a malformed one)."""
        try:
            return cls(str(d["phase"]), int(d["step"]), int(d["epoch"]), int(d["size"]),
                       tuple(int(r) for r in d["rows"]))  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return None


class BatchMarker:
    """Writes the marks of one process to ``path`` (created, or overwritten from its start)."""

    def __init__(self, path: Path, keep: int = KEEP_ROWS) -> None:
        self.keep = keep
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o640)

    def mark(self, phase: str, step: int, epoch: int, rows: Sequence[int] | Any = ()) -> None:
        """Record that the process now runs ``phase`` at ``step``/``epoch`` on dataset ``rows`` (a
        numpy array, or a list of indices)."""
        part = rows[: self.keep]
        packed = (
            part.astype("int64", copy=False).tobytes()
            if hasattr(part, "astype")
            else array("q", part).tobytes()
        )
        os.pwrite(self._fd, HEADER.pack(phase.encode(), step, epoch, len(rows), len(part)) + packed, 0)

    def close(self) -> None:
        os.close(self._fd)


def read_mark(path: Path) -> BatchMark | None:
    """The last mark written to ``path``; None when there is none or it is unreadable."""
    try:
        raw = Path(path).read_bytes()
        phase, step, epoch, size, count = HEADER.unpack_from(raw)
        rows = array("q")
        rows.frombytes(raw[HEADER.size : HEADER.size + 8 * count])
        if len(rows) != count:
            return None
        return BatchMark(phase.rstrip(b"\0").decode(), step, epoch, size, tuple(rows))
    except (OSError, struct.error, UnicodeDecodeError):
        return None
