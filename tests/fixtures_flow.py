"""Session fixtures of the flow area: a tiny real ONNX classifier with its test set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest


@dataclass(frozen=True)
class TinyClassifier:
    """A small torch MLP exported to ONNX (eval mode), a test set, and torch's own logits on it."""

    onnx: Path
    test_npz: Path
    x: np.ndarray
    y: np.ndarray
    torch_logits: np.ndarray


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory: pytest.TempPathFactory) -> TinyClassifier:
    """Export a seeded 3-class MLP with torch and write a labelled test set beside it."""
    import torch

    out = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=150).astype(np.int64)
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).numpy()
    onnx_path = out / "tiny.onnx"
    torch.onnx.export(
        model,
        (torch.from_numpy(x[:1]),),
        str(onnx_path),
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "n"}, "output": {0: "n"}},
        dynamo=False,
        opset_version=17,
    )
    np.savez(out / "test.npz", x=x, y=y)
    return TinyClassifier(onnx_path, out / "test.npz", x, y, logits)
