"""The fleet flow (flows/fleet.py) in process (Prefect test API, local-transport boards): rounds over a group,
the aggregate is the sample-weighted mean of what the boards sent back, a board without data is
reported while the quorum holds, and a round below the quorum fails the run naming each board.
tests/e2e/test_fleet_vboard.py runs it on virtual boards through deployment odl/fleet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[2] / "recipes" / "data" / "digits-fleet"


@pytest.fixture(scope="module")
def fleet_group(flow_home, board_python):
    """Boards f0, f1 (each with its own half of the non-IID split) and f2 (no dataset folder)."""
    from tasks import stages
    from tasks.board.inventory import Board, save_board, save_group
    from tasks.paths import PROJECT_ROOT
    from tasks.recipe.load import load_recipe

    stages.prepare_data(load_recipe(PROJECT_ROOT / "recipes" / "digits_fleet.toml"))
    for i in range(3):
        root = flow_home / f"fleet-f{i}"
        shutil.rmtree(root, ignore_errors=True)
        if i < 2:
            (root / "datasets" / "digits").mkdir(parents=True)
            shutil.copy(DATA / "boards-2" / f"board-{i}.npz", root / "datasets" / "digits" / "part-1.npz")
        save_board(Board(name=f"f{i}", transport="local", root=str(root), python=str(board_python)))
    save_group("trio", ["f0", "f1", "f2"])
    return ["f0", "f1", "f2"]


def _weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_rounds_average_what_the_boards_sent_and_go_on_without_a_failed_board(prefect_harness, fleet_group):
    from flows.fleet import FleetParams, odl_fleet

    state = odl_fleet(FleetParams(group="trio", rounds=2, min_boards=2, epochs=1), return_state=True)
    assert state.is_completed(), state.message
    out = state.result()
    rounds = out.summary["rounds"]
    assert [r["took_part"] for r in rounds] == [["f0", "f1"], ["f0", "f1"]]
    f2 = rounds[0]["boards"]["f2"]
    assert f2["status"] == "failed" and "datasets/digits" in f2["error"]
    from tasks.paths import state_dir

    run = next(p for p in state_dir("fleet").iterdir() if (p / "rounds.json").is_file()
               and json.loads((p / "rounds.json").read_text())["run_id"] == out.summary["run_id"])  # fmt: skip
    for rec in rounds:
        r = rec["round"]
        ups = [
            (_weights(run / f"round-{r:03d}" / b / "trainable.npz"), rec["boards"][b]["samples"])
            for b in ("f0", "f1")
        ]
        total = sum(n for _, n in ups)
        agg = _trainable(run / f"round-{r:03d}" / "aggregate.ckpt")
        for name, w in agg.items():
            mean = sum(u[name].astype(np.float64) * n / total for u, n in ups)
            assert np.allclose(w, mean, atol=1e-6), name
        tensor_bytes = sum(w.nbytes for w in agg.values())
        # only the trained tensors come back: each board's upload is its trainable.npz
        assert rec["bytes_up"] == sum(rec["boards"][b]["bytes_up"] for b in ("f0", "f1"))
        assert all(tensor_bytes <= rec["boards"][b]["bytes_up"] < tensor_bytes + 4096 for b in ("f0", "f1"))
        assert rec["aggregate"]["samples"] == 197
    # round 2 starts from round 1's aggregate: the round-2 checkpoint holds exactly those weights
    agg1 = _trainable(run / "round-001" / "aggregate.ckpt")
    start2 = _trainable(run / "round-002" / "global.ckpt")
    assert all(np.array_equal(agg1[k], start2[k]) for k in agg1)
    assert (
        rounds[1]["bytes_down"] < rounds[0]["bytes_down"]
    )  # artifacts went up once; then the checkpoint only
    report = (state_dir("reports", "digits_fleet-trio") / "fleet.md").read_text()
    assert "**failed**" in report and "Round 2: 2 of 3 boards" in report
    assert out.version.startswith("v")


def test_a_round_below_the_quorum_fails_the_run_naming_each_missing_board(prefect_harness, fleet_group):
    from flows.fleet import FleetParams, odl_fleet
    from tasks.paths import state_dir

    state = odl_fleet(FleetParams(group="trio", rounds=2, min_boards=3, epochs=1), return_state=True)
    assert state.is_failed()
    with pytest.raises(
        Exception, match=r"round 1: 2 of 3 boards finished, the quorum is 3 .*\(f2\): DataError"
    ):
        state.result()
    report = (state_dir("reports", "digits_fleet-trio") / "fleet.md").read_text()
    assert "No aggregate: the quorum was not reached" in report


def _trainable(ckpt: Path) -> dict[str, np.ndarray]:
    from tasks.checkpoint import checkpoint_weights

    return checkpoint_weights(ckpt, trainable_only=True)


def test_rounds_under_the_autograd_runtime(prefect_harness, fleet_group):
    """training.runtime = 'autograd': each round's global checkpoint is an npz (the split's, the frozen
    prefix cached on the boards), the aggregate is the boards' sample-weighted mean and round 2 starts
    from round 1's aggregate."""
    from flows.fleet import FleetParams, odl_fleet
    from tasks.checkpoint import autograd_checkpoint
    from tasks.paths import state_dir

    params = FleetParams(
        group="trio", rounds=2, min_boards=2, epochs=1, overrides={"training.runtime": "autograd"}
    )
    state = odl_fleet(params, return_state=True)
    assert state.is_completed(), state.message
    out = state.result()
    rounds = out.summary["rounds"]
    assert [r["took_part"] for r in rounds] == [["f0", "f1"], ["f0", "f1"]]
    run = next(p for p in state_dir("fleet").iterdir() if (p / "rounds.json").is_file()
               and json.loads((p / "rounds.json").read_text())["run_id"] == out.summary["run_id"])  # fmt: skip
    for rec in rounds:
        folder = run / f"round-{rec['round']:03d}"
        assert autograd_checkpoint(folder / "global.ckpt") and autograd_checkpoint(folder / "aggregate.ckpt")
        ups = [(_weights(folder / b / "trainable.npz"), rec["boards"][b]["samples"]) for b in ("f0", "f1")]
        total = sum(n for _, n in ups)
        for name, w in _trainable(folder / "aggregate.ckpt").items():
            assert np.allclose(w, sum(u[name].astype(np.float64) * n / total for u, n in ups), atol=1e-6), (
                name
            )
    agg1, start2 = (
        _trainable(run / "round-001" / "aggregate.ckpt"),
        _trainable(run / "round-002" / "global.ckpt"),
    )
    assert agg1.keys() == start2.keys() and all(np.array_equal(agg1[k], start2[k]) for k in agg1)
