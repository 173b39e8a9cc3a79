"""A mixed fleet: one FedAvg round over a board the host drives with commands (local transport: the
SSH path's code, the agent's commands) and a board that can only dial out (pull mode: its agent's
service checks in with a real TLS endpoint), in process. The round's aggregate equals the one the
same two boards' data gives when both are command boards: the stages, the fleet flow and the
aggregation do not know which transport a board has, and the pull board's update is the same bytes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tasks.paths import PROJECT_ROOT
from tests.board.pull_kit import running_endpoint
from tests.fleet.kit import DATA, local_board, prepare_fleet_data

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mixed(flow_home, board_python):
    """Boards m0 (local), m1 (pull, enrolled with a one-time code, its service running) and m1x
    (local, m1's data); groups mixed = [m0, m1] and commanded = [m0, m1x]."""
    from tasks.board.inventory import Board, save_board, save_group

    prepare_fleet_data()
    local_board(flow_home, "m0", DATA / "boards-2" / "board-0.npz", str(board_python))
    local_board(flow_home, "m1x", DATA / "boards-2" / "board-1.npz", str(board_python))
    local_board(flow_home, "m1", DATA / "boards-2" / "board-1.npz", str(board_python))  # its root and data
    root = flow_home / "fleet-m1"
    with running_endpoint(flow_home / "pull") as ep:
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        agent = [str(board_python), "-m", "device_agent", "--root", str(root)]
        code = ep.mailbox.invite("m1")
        enrol = subprocess.run([*agent, "enrol", "--endpoint", ep.url, "--pin", ep.pin, "--name", "m1",
                                "--code", code], env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert enrol.returncode == 0, enrol.stderr
        save_board(Board(name="m1", root=str(root), transport="pull", python=str(board_python)))
        service = subprocess.Popen([*agent, "pull"], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)  # fmt: skip
        save_group("mixed", ["m0", "m1"])
        save_group("commanded", ["m0", "m1x"])
        try:
            yield ep
        finally:
            service.terminate()
            service.wait(10)


def _round(group: str) -> tuple[dict, Path]:
    from flows.fleet import FleetParams, odl_fleet
    from tasks.paths import state_dir

    state = odl_fleet(FleetParams(group=group, rounds=1, min_boards=2, epochs=1), return_state=True)
    assert state.is_completed(), state.message
    out = state.result()
    run = next(p for p in state_dir("fleet").iterdir() if (p / "rounds.json").is_file()
               and json.loads((p / "rounds.json").read_text())["run_id"] == out.summary["run_id"])  # fmt: skip
    return out.summary["rounds"][0], run / "round-001"


def _trainable(ckpt: Path) -> dict[str, np.ndarray]:
    from tasks.checkpoint import checkpoint_weights

    return checkpoint_weights(ckpt, trainable_only=True)


def test_a_mixed_round_aggregates_as_an_all_command_round(prefect_harness, mixed):
    mixed_round, mixed_dir = _round("mixed")
    assert mixed_round["took_part"] == ["m0", "m1"]
    assert mixed.mailbox.board("m1").last_seen is not None  # m1 took its job at a check-in
    commanded_round, commanded_dir = _round("commanded")
    sent = np.load(mixed_dir / "m1" / "trainable.npz")
    same = np.load(commanded_dir / "m1x" / "trainable.npz")
    assert sorted(sent.files) == sorted(same.files)
    # the pull board's update: the same bytes
    assert all(np.array_equal(sent[k], same[k]) for k in sent.files)
    a, b = _trainable(mixed_dir / "aggregate.ckpt"), _trainable(commanded_dir / "aggregate.ckpt")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert mixed_round["aggregate"]["samples"] == commanded_round["aggregate"]["samples"]
