"""The run log of a training: one line per epoch, carrying its training and eval figures."""

from __future__ import annotations

import logging
import re

import pytest

from device_agent.job.events import read_events
from device_agent.protocol import Event
from tasks.prefect import progress


class _Log:
    """A run logger that keeps (level, message) pairs."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def log(self, level: int, msg: str, *args: object) -> None:
        self.lines.append((level, msg % args))

    def info(self, msg: str, *args: object) -> None:
        self.log(logging.INFO, msg, *args)


@pytest.mark.slow
def test_each_epoch_is_one_run_log_line_with_train_and_eval_figures(agent_board, digits_job, monkeypatch):
    """A real agent job with an eval set (the digits recipe: 3 epochs, a checkpoint every few steps)
    replayed through the flow's progress callback: the run log (INFO) holds each epoch's line once,
    and that line has the eval figures the agent's separate "eval" event carried."""
    import prefect.artifacts
    import prefect.logging

    spec, files = digits_job("one-line-per-epoch", epochs=3, checkpoint_every=5)
    jdir = agent_board.install(spec, files)
    assert agent_board.run("run", str(jdir)).code == 0
    events = [
        Event(e["type"], e["job_id"], e["seq"], e.get("data") or {})
        for e in read_events(jdir / "events.jsonl")
    ]
    assert {"eval", "checkpoint"} <= {e.type for e in events}  # what the log must not repeat is there
    log = _Log()
    monkeypatch.setattr(prefect.logging, "get_run_logger", lambda: log)
    monkeypatch.setattr(prefect.artifacts, "update_progress_artifact", lambda *a, **k: None)
    monkeypatch.setattr(progress.boards, "emit", lambda *a, **k: None)
    watcher = progress.BoardProgress("b1", 3, artifact_id=None, min_interval_s=0.0)
    for event in events:
        watcher(event)
    shown = [msg for level, msg in log.lines if level >= logging.INFO]
    per_epoch = [m for m in shown if re.search(r"\bepoch=\d+\b", m) and not m.startswith("board b1: step ")]
    assert [re.search(r"\bepoch=(\d+)", m).group(1) for m in per_epoch] == ["1", "2", "3"], shown
    evals = [e.data for e in events if e.type == "eval"]
    for line, figures in zip(per_epoch, evals, strict=True):
        assert line.startswith("board b1: epoch ") and "train_loss=" in line, line
        assert f"eval_loss={figures['eval_loss']:.4g}" in line, (line, figures)
