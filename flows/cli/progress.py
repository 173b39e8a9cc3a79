"""What ``odl run`` and ``odl flow`` show while they work: live progress bars (rich) for the upload,
the board's training (steps, loss, ETA) and the download on a terminal; plain lines, at most one
every 2 s per bar, when stderr is not a terminal (CI logs, pipes)."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from device_agent.protocol import Event
from flows.cli.terminal import console

PLAIN_EVERY_S = 2.0
QUIET_EVENTS = ("eval", "checkpoint")  # the epoch line that follows carries the same figures


class Bars:
    """Upload, training and download progress; use as a context manager around the work."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.live = enabled and console().is_terminal
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        self.last_plain: dict[str, float] = {}
        self.total_steps: int | None = None

    def __enter__(self) -> Bars:
        if self.live:
            self.progress = Progress(
                TextColumn("{task.description:<9}"),
                BarColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeRemainingColumn(),
                console=console(),
                transient=False,
            )
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def upload(self, done: int, total: int) -> None:
        """Upload progress callback (bytes)."""
        self._bytes("upload", done, total)

    def download(self, done: int, total: int) -> None:
        """Download progress callback (bytes; the total may be unknown and equal ``done``)."""
        self._bytes("download", done, total)

    def event(self, ev: Event) -> None:
        """Training event callback: steps move the bar, other events become lines."""
        d = ev.data or {}
        if ev.type == "started" and isinstance(d.get("total_steps"), int):
            self.total_steps = d["total_steps"]
        if ev.type == "step":
            loss = d.get("loss")
            step = int(d.get("step", 0))
            of = f"/{self.total_steps}" if self.total_steps else ""
            detail = f"step {step}{of} epoch {int(d.get('epoch', 0)) + 1}"
            detail += f" loss {loss:.4f}" if isinstance(loss, int | float) else ""
            self._set("train", step, self.total_steps, detail)
            return
        if ev.type in ("finished", "failed", "cancelled") and self.total_steps:
            done = int(d.get("steps", d.get("step", 0)) or 0)
            self._set(
                "train", done, self.total_steps, f"step {done}/{self.total_steps} {ev.type}", force=True
            )
        if self.enabled and ev.type not in QUIET_EVENTS:
            self._line(f"board: {ev.type} {_brief(d)}")

    def _bytes(self, name: str, done: int, total: int) -> None:
        mb = f"{done / 1e6:.1f} MB" if total == done else f"{done / 1e6:.1f}/{total / 1e6:.1f} MB"
        self._set(name, done, total or None, mb, force=bool(total) and done >= total)

    def _set(self, name: str, done: int, total: int | None, detail: str, force: bool = False) -> None:
        if not self.enabled:
            return
        if self.progress is not None:
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(name, total=total, detail=detail)
            self.progress.update(self.tasks[name], completed=done, total=total, detail=detail)
            return
        now = time.monotonic()
        if force or now - self.last_plain.get(name, 0.0) >= PLAIN_EVERY_S:
            self.last_plain[name] = now
            self._line(f"{name} {detail}".strip())

    def _line(self, text: str) -> None:
        if self.progress is not None:
            console().print(text, highlight=False, soft_wrap=True)
        else:
            print(text, file=sys.stderr, flush=True)


def _brief(data: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in sorted(data.items())
        if isinstance(v, int | float | str)
    )
