"""What ``odl run`` and ``odl flow`` show while they work: live progress bars (rich) for the upload,
the board's training (steps, loss, ETA), a teacher's labelling and the download on a terminal.

When stderr is not a terminal (CI logs, pipes, files) each bar is a few plain lines instead: its
start, its first update in each further tenth of its total and its end (:class:`Milestones`: at
most 12 lines a bar, whatever the job's size or how often its reporter calls back); a bar whose
total is unknown (an SSH download) prints its start and its end. The board's epoch lines are
thinned the same way against the job's steps."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from device_agent.protocol import Event
from flows.cli.terminal import console

PARTS = 10  # without a terminal, a bar prints a line per tenth of its total
QUIET_EVENTS = ("eval", "checkpoint")  # the epoch line that follows carries the same figures
ENDS = ("finished", "failed", "cancelled")


class Milestones:
    """Which updates of one bar are a plain line: the first, the first in each further ``1/parts``
    of the total, and the end (once: when the total is reached, or by :meth:`end`); a bar without
    a total prints its first update and its end only."""

    def __init__(self, parts: int = PARTS) -> None:
        self.parts, self.shown, self.ended = parts, -1, False

    def due(self, done: float, total: float | None) -> bool:
        """Whether the update ``done`` of ``total`` is a line (reaching the total ends the bar)."""
        if self.ended:
            return False
        part = min(self.parts, int(self.parts * done // total)) if total and total > 0 else 0
        if part <= self.shown:
            return False
        self.shown, self.ended = part, part == self.parts
        return True

    def end(self) -> bool:
        """Whether the bar's end is a line: once, for a bar that started and did not reach its total."""
        due = self.shown >= 0 and not self.ended
        self.ended = True
        return due


@dataclass
class _Bar:
    """One bar: its milestones, its latest figures (as text when asked), and for a bar whose
    reporter counts each file from 0 (``per_file``) the bytes of the files before this one."""

    per_file: bool = False
    base: int = 0
    done: int = 0
    last: Callable[[], str] | None = None
    marks: Milestones = field(default_factory=Milestones)


class Bars:
    """Upload, training, labelling and download progress; use as a context manager around the work."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.live = enabled and console().is_terminal
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        self.bars: dict[str, _Bar] = {"download": _Bar(per_file=True)}
        self.epochs = Milestones()
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

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        for name in self.bars:  # a bar without a total (a download) or stopped short ends here
            self._end(name, "done" if kind is None else "stopped")
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def upload(self, done: int, total: int) -> None:
        """Upload progress callback (bytes of the whole upload)."""
        self._bytes("upload", done, total)

    def download(self, done: int, total: int) -> None:
        """Download progress callback (bytes of the current file, each file counted from 0; the
        total may be unknown and equal ``done``): the bar counts every file's bytes."""
        self._bytes("download", done, total)

    def event(self, ev: Event) -> None:
        """Training event callback: steps and labels move bars, other events become lines."""
        d = ev.data or {}
        if ev.type == "started" and isinstance(d.get("total_steps"), int):
            self.total_steps = d["total_steps"]
        if ev.type == "step":
            self._set("train", int(d.get("step", 0)), self.total_steps, lambda: self._step_detail(d))
            return
        if ev.type == "labels":
            done, total = int(d.get("done", 0)), int(d.get("total", 0)) or None
            self._set("label", done, total, lambda: f"{done}/{total or '?'} samples")
            return
        if ev.type in ENDS and self.total_steps:
            done = int(d.get("steps", d.get("step", 0)) or 0)
            self._set(
                "train", done, self.total_steps, lambda: f"step {done}/{self.total_steps} {ev.type}", end=True
            )
        if ev.type == "epoch" and not self.live and not self.epochs.due(d.get("step", 0), self.total_steps):
            return  # without a terminal: the first epoch, one per tenth of the steps, the last
        if self.enabled and ev.type not in QUIET_EVENTS:
            self._line(f"board: {ev.type} {_brief(d)}")

    def _step_detail(self, d: dict[str, Any]) -> str:
        loss = d.get("loss")
        of = f"/{self.total_steps}" if self.total_steps else ""
        detail = f"step {int(d.get('step', 0))}{of} epoch {int(d.get('epoch', 0)) + 1}"
        return detail + (f" loss {loss:.4f}" if isinstance(loss, int | float) else "")

    def _bytes(self, name: str, done: int, total: int) -> None:
        bar = self.bars.setdefault(name, _Bar())
        if bar.per_file:  # the sum over the files still to come is unknown
            bar.base += bar.done if done < bar.done else 0  # a smaller count: the next file
            bar.done = done
            done, total = bar.base + done, 0
        of = total or None
        self._set(name, done, of, lambda: _mb(done, of))

    def _set(
        self, name: str, done: int, total: int | None, detail: Callable[[], str], end: bool = False
    ) -> None:
        """Move bar ``name`` (``end``: to its last update): live, on every update; plain, on the
        updates its milestones call for."""
        if not self.enabled:
            return
        bar = self.bars.setdefault(name, _Bar())
        bar.last = detail
        if self.progress is not None:
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(name, total=total, detail="")
            self.progress.update(self.tasks[name], completed=done, total=total, detail=detail())
            return
        due = bar.marks.due(done, total)
        if end and bar.marks.end() or due:  # end(): a line unless the one at the total was shown
            self._line(f"{name} {detail()}")

    def _end(self, name: str, how: str) -> None:
        """Without a terminal, the bar's last figures and ``how`` it ended, unless its line at its
        total was shown."""
        bar = self.bars.get(name)
        if bar is not None and bar.last is not None and bar.marks.end() and self.progress is None:
            self._line(f"{name} {bar.last()} {how}")

    def _line(self, text: str) -> None:
        if self.progress is not None:
            console().print(text, highlight=False, soft_wrap=True)
        else:
            print(text, file=sys.stderr, flush=True)


def _mb(done: int, total: int | None) -> str:
    if not total:
        return f"{done / 1e6:.1f} MB"
    return f"{done / 1e6:.1f}/{total / 1e6:.1f} MB ({100 * done / total:.0f} %)"


def _brief(data: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in sorted(data.items())
        if isinstance(v, int | float | str)
    )
