"""Differential privacy through the fleet flow (local-transport boards): the privacy budget stops
the rounds before ε would pass the recipe's target (k computed here by the accountant on its own),
and in local mode what the host receives is the board's clipped update plus Gaussian noise, never
the raw one (checked against the same round trained without privacy), and nothing raw stays in the
board's job folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fleet.kit import DATA, local_board, prepare_fleet_data

pytestmark = pytest.mark.slow

DELTA, Z = 1e-5, 1.0


@pytest.fixture(scope="module")
def duo(flow_home, board_python):
    """Boards d0, d1, each with its half of the 2-board non-IID split, in group ``duo``."""
    from tasks.board.inventory import save_group

    prepare_fleet_data()
    for i in range(2):
        local_board(flow_home, f"d{i}", DATA / "boards-2" / f"board-{i}.npz", str(board_python))
    save_group("duo", ["d0", "d1"])
    return flow_home


def _run(rounds: int, privacy: dict | None, epochs: int = 1):
    from flows.fleet import FleetParams, odl_fleet

    overrides = {"fleet.privacy": privacy} if privacy else {}
    params = FleetParams(group="duo", rounds=rounds, epochs=epochs, min_boards=2, overrides=overrides)
    state = odl_fleet(params, return_state=True)
    assert state.is_completed(), state.message
    return state.result()


def _run_dir(run_id: str) -> Path:
    from tasks.paths import state_dir

    return next(p for p in state_dir("fleet").iterdir() if (p / "rounds.json").is_file()
                and json.loads((p / "rounds.json").read_text())["run_id"] == run_id)  # fmt: skip


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k].astype(np.float64) for k in z.files}


def test_the_budget_stops_the_rounds_before_epsilon_passes_the_target(prefect_harness, duo):
    from opacus.accountants import RDPAccountant

    from tasks.fleet.privacy import ALPHAS
    from tasks.judge.registry import Registry
    from tasks.paths import odl_home, state_dir

    target = 8.0
    accountant, k = RDPAccountant(), 0
    for r in range(1, 5):  # the accountant's own stepping, round by round
        accountant.step(noise_multiplier=Z, sample_rate=1.0)
        if accountant.get_epsilon(delta=DELTA, alphas=ALPHAS) > target:
            break
        k = r
    assert 0 < k < 4
    privacy = {"target_epsilon": target, "delta": DELTA, "clip": 0.5, "noise_multiplier": Z}
    out = _run(4, privacy)
    rounds = out.summary["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, k + 1))
    eps = [r["privacy"]["epsilon"] for r in rounds]
    assert eps == sorted(eps) and eps[-1] <= target
    assert f"round {k + 1} was not run" in out.summary["stopped"]
    assert (
        json.loads((_run_dir(out.summary["run_id"]) / "rounds.json").read_text())["stopped"]
        == out.summary["stopped"]
    )
    assert rounds[0]["noise"]["updates"] == 2 and rounds[0]["noise"]["noise_std_of_mean"] == pytest.approx(
        0.25
    )
    report = (state_dir("reports", "digits_fleet-duo") / "fleet.md").read_text()
    assert "**Stopped early**" in report and f"after {k} rounds" in report and "central DP" in report
    entry = Registry(odl_home() / "registry").versions("digits_fleet", "duo")[-1]
    assert entry.info["privacy"]["epsilon"] == pytest.approx(eps[-1]) and entry.info["privacy"]["rounds"] == k


def test_a_target_below_one_round_is_refused_before_any_board_is_asked(prefect_harness, duo):
    from flows.fleet import FleetParams, odl_fleet

    privacy = {"target_epsilon": 0.5, "delta": DELTA, "clip": 0.5, "noise_multiplier": Z}
    state = odl_fleet(
        FleetParams(group="duo", rounds=2, overrides={"fleet.privacy": privacy}), return_state=True
    )
    assert state.is_failed()
    with pytest.raises(
        Exception, match=r"fleet.privacy.target_epsilon': expected at least the ε of one round"
    ):
        state.result()


def test_local_noise_means_the_host_never_receives_a_raw_update(prefect_harness, duo):
    clip = 0.05
    private = _run(
        1, {"target_epsilon": 10.0, "delta": DELTA, "clip": clip, "noise_multiplier": Z, "mode": "local"}
    )
    raw = _run(1, None)  # the same round without privacy: what each board would have sent
    pdir, rdir = _run_dir(private.summary["run_id"]), _run_dir(raw.summary["run_id"])
    start = _npz_ckpt(pdir / "round-001" / "global.ckpt")
    for board in ("d0", "d1"):
        got_files = sorted(p.name for p in (pdir / "round-001" / board).iterdir())
        # the job's logs and result, and the one file of tensors it fetched: nothing else of the model
        assert got_files == ["agent.log", "events.jsonl", "result.json", "trainable.npz"], got_files
        got, sent_raw = (
            _npz(pdir / "round-001" / board / "trainable.npz"),
            _npz(rdir / "round-001" / board / "trainable.npz"),
        )
        delta = {k: sent_raw[k] - start[k] for k in start}
        norm = np.sqrt(sum(float(np.sum(v**2)) for v in delta.values()))
        assert norm > 2 * clip  # the raw update is well past the clipping bound
        clipped = {k: v * min(1.0, clip / norm) for k, v in delta.items()}
        noise = np.concatenate([(got[k] - start[k] - clipped[k]).ravel() for k in start])
        assert abs(noise.std() / (Z * clip) - 1) < 6 / np.sqrt(2 * noise.size) + 0.02  # N(0, (z C)^2) on top
        assert not any(np.allclose(got[k], sent_raw[k], atol=Z * clip / 10) for k in start)
        job = duo / f"fleet-{board}" / "jobs" / private.summary["rounds"][0]["boards"][board]["job_id"]
        left = sorted(p.name for p in job.iterdir())
        assert "checkpoints" not in left and "inference.onnx" not in left, left
        assert list(json.loads((job / "result.json").read_text())["outputs"]) == ["trainable"]
    assert private.summary["privacy"]["mode"] == "local"


def _npz_ckpt(ckpt: Path) -> dict[str, np.ndarray]:
    from tasks.checkpoint import checkpoint_weights

    return {k: v.astype(np.float64) for k, v in checkpoint_weights(ckpt, trainable_only=True).items()}
