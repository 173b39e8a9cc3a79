"""What the shared store's tests use: a candidate's decision without a recipe, and a model file."""

from __future__ import annotations

from pathlib import Path

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
