"""Atomic, resumable checkpoints: ``checkpoints/ckpt-<step>`` with optimizer state + progress.

A checkpoint is saved under a ``.tmp`` name, fsync'd, then renamed; the previous one is deleted
only after the new one is complete, so a crash at any moment leaves one whole checkpoint.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device_agent.atomic import fsync_dir

PREFIX = "ckpt-"
KEEP = 2


@dataclass
class Progress:
    """Where training stands; stored in the checkpoint's properties."""

    step: int = 0
    epoch: int = 0  # epochs completed
    history: list[dict[str, float]] = field(default_factory=list)
    loss_sum: float = 0.0  # running sums of the epoch in progress
    seen: int = 0
    correct: float = 0  # correct samples (segmentation: the sum of the images' pixel accuracies)
    batches: int = 0
    train_loop_s: float = 0.0

    def to_properties(self) -> dict[str, int | float | str]:
        """ORT checkpoint properties; the running sums go as JSON text (ORT keeps floats as float32)."""
        sums = {"history": self.history, "loss_sum": self.loss_sum, "seen": self.seen,
                "correct": self.correct, "batches": self.batches, "train_loop_s": self.train_loop_s}  # fmt: skip
        return {"step": self.step, "epoch": self.epoch, "progress": json.dumps(sums)}

    @classmethod
    def from_properties(cls, props: Any) -> Progress:
        """Rebuild from a loaded CheckpointState's properties (fresh artifacts have none)."""
        if "step" not in props:
            return cls()
        sums = json.loads(str(props["progress"]))
        return cls(step=int(props["step"]), epoch=int(props["epoch"]), **sums)

    def reset_epoch(self) -> None:
        """Start the running sums of a new epoch."""
        self.loss_sum, self.seen, self.correct, self.batches = 0.0, 0, 0, 0


def latest_checkpoint(ckdir: Path) -> Path | None:
    """The newest complete checkpoint, or None. Leftover ``.tmp`` files are removed."""
    if not ckdir.is_dir():
        return None
    for tmp in ckdir.glob("*.tmp"):
        tmp.unlink(missing_ok=True)
    done = sorted(p for p in ckdir.glob(PREFIX + "*") if p.name[len(PREFIX) :].isdigit())
    return done[-1] if done else None


def save_checkpoint(api: Any, state: Any, ckdir: Path, progress: Progress) -> Path:
    """Save state + optimizer state + progress atomically; keep the previous one. Returns the path."""
    ckdir.mkdir(parents=True, exist_ok=True)
    for key, value in progress.to_properties().items():
        state.properties[key] = value
    final = ckdir / f"{PREFIX}{progress.step:08d}"
    write_state(api, state, final)
    for old in sorted(p for p in ckdir.glob(PREFIX + "*") if p.name[len(PREFIX) :].isdigit())[:-KEEP]:
        old.unlink(missing_ok=True)
    return final


def write_state(api: Any, state: Any, path: Path) -> None:
    """CheckpointState.save_checkpoint to ``path`` via tmp + fsync + rename."""
    tmp = path.with_name(path.name + ".tmp")
    api.CheckpointState.save_checkpoint(state, str(tmp), include_optimizer_state=True)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
