"""Session fixtures of the flow area: a tiny real ONNX classifier with its test set, a Prefect test
API, the board the flow tests use (local transport) and a real Prefect stack for tests/e2e."""

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


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API for this session (heartbeats off: each flow call saves ~1 s)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield


@pytest.fixture(scope="session")
def flow_home(local_board_home):
    """ODL_HOME for the flow tests (inventory, registry, runs): the local-transport board's home.
    tests/e2e/test_flow_vboard.py overrides it with the virtual board's home."""
    from tests.fixtures_board import odl_home_env

    with odl_home_env(local_board_home):
        yield local_board_home


@pytest.fixture(scope="session")
def flow_board(flow_home):
    """The board the flow tests train on: ``here`` (local transport, no root)."""
    from tasks.board.inventory import get_board

    return get_board("here")


@pytest.fixture(scope="session")
def prefect_stack(virtual_board, virtual_board_home):
    """A real Prefect server + process worker + deployment odl/full (tasks.stack) on a free port."""
    import socket

    from tasks.stack import server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = server.stack_env(port=port, home=virtual_board_home)
    try:
        server.up(env)
        yield env
    finally:
        server.down(virtual_board_home)
