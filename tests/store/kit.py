"""What the shared store's tests use: a candidate's decision without a recipe, a model file, and
the session that waits on a lock."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from tasks.judge.decision import Decision


def verdict(promote: bool, accuracy: float = 0.5) -> Decision:
    """A promotion verdict of ``accuracy`` against a base of 0.0."""
    reason = f"{'ok' if promote else 'FAIL'} min_gain: accuracy {accuracy:.4f} vs 0.0000 (base)"
    return Decision(promote, "accuracy", accuracy, 0.0, "base", accuracy, 0.0, reason)


def model_file(folder: Path, content: bytes, name: str = "cand.onnx") -> Path:
    """A candidate's model file holding ``content``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(content)
    return path


def waiting_pid(cfg, statement: str) -> int:  # noqa: ANN001 - a StoreConfig
    """The pid of the store session whose statement starting with ``statement`` waits on a lock (10 s
    at most; each look on a connection of its own: pg_stat_activity is read once per transaction)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with psycopg.connect(**cfg.connect_kwargs()) as watch:
            row = watch.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                                "starts_with(query, %s)", (statement,)).fetchone()  # fmt: skip
        if row:
            return row[0]
        time.sleep(0.05)
    raise AssertionError(f"no store session waits in {statement!r}")
