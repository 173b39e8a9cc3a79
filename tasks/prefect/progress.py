"""Live training progress in the Prefect UI: board events become run-log lines and a progress
artifact (updated at most every 2 s: each update is a write to Prefect's API)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from device_agent.protocol import Event
from tasks.prefect import boards

JOB_EVENTS = {"started": "started", "epoch": "progress", "finished": "finished", "failed": "failed"}
# Debug lines only: the agent's "eval" row is the epoch's row that its "epoch" event repeats (train
# and eval figures), and a checkpoint follows every epoch; the run log keeps one line per epoch.
QUIET_EVENTS = ("eval", "checkpoint")


class Observer(Protocol):
    """Who else watches a run in this process (the ``odl`` command's progress bars)."""

    def upload(self, done: int, total: int) -> None: ...
    def event(self, event: Event) -> None: ...
    def download(self, done: int, total: int) -> None: ...


class _Nobody:
    def upload(self, done: int, total: int) -> None:
        pass

    def event(self, event: Event) -> None:
        pass

    def download(self, done: int, total: int) -> None:
        pass


_observer: list[Observer] = [_Nobody()]


def terminal() -> Observer:
    """The observer the flow's tasks report upload, training and download progress to."""
    return _observer[0]


def watch(observer: Observer | None) -> None:
    """Set (or with None, clear) the in-process observer of the flow's progress."""
    _observer[0] = observer or _Nobody()


class BoardProgress:
    """``on_event`` callback: board events -> flow-run log lines and a Prefect progress artifact."""

    # Each update is a write to Prefect's API; on the embedded SQLite server frequent writes contend
    # with the server's own writers (503s, slow answers), so the UI's progress moves every 2 s at most.
    def __init__(
        self,
        board: str,
        epochs: int,
        artifact_id: Any,
        min_interval_s: float = 2.0,
        echo: Callable[[Event], None] | None = None,
    ) -> None:
        self.board, self.epochs, self.artifact_id, self.echo = board, max(epochs, 1), artifact_id, echo
        self.min_interval_s, self.last_update, self.percent = min_interval_s, 0.0, 0.0
        self.shown = 0.0  # the value the artifact shows now
        self.total_steps: int | None = None

    def __call__(self, event: Event) -> None:
        """Record the event, log a progress line and move the progress artifact."""
        from prefect.logging import get_run_logger  # Prefect only inside a flow run

        if self.echo is not None:
            self.echo(event)
        data = event.data or {}
        self.total_steps = data.get("total_steps", self.total_steps)
        if event.type == "step" and self.total_steps:
            self.percent = max(self.percent, 100.0 * data.get("step", 0) / self.total_steps)
        elif event.type == "epoch":
            self.percent = max(self.percent, 100.0 * data.get("epoch", 0) / self.epochs)
        if event.type != "step" or self.total_steps is None:
            level = logging.DEBUG if event.type in QUIET_EVENTS else logging.INFO
            get_run_logger().log(level, "board %s: %s %s", self.board, event.type, _brief(data))
        if event.type in JOB_EVENTS:
            payload = {k: v for k, v in data.items() if isinstance(v, (int, float, str))}
            boards.emit(f"odl.job.{JOB_EVENTS[event.type]}", self.board, payload)
        self._update(force=event.type in ("finished", "failed"))

    def _update(self, force: bool = False) -> None:
        from prefect.artifacts import update_progress_artifact  # Prefect only inside a flow run

        value = round(min(self.percent, 100.0), 1)
        if value == self.shown:
            return
        if force or time.monotonic() - self.last_update >= self.min_interval_s:
            update_progress_artifact(self.artifact_id, value)
            self.last_update, self.shown = time.monotonic(), value

    def done(self) -> None:
        """Set the artifact to 100 % once the result is in."""
        self.percent = 100.0
        self._update(force=True)


def _brief(data: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in data.items()
        if isinstance(v, (int, float, str))
    )
