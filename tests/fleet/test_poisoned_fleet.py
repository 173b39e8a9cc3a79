"""Fault injection (issue 38): eight local-transport boards of the 8-board non-IID split, one of them
(p7) running a tampered agent that sends back a scaled, sign-flipped update (x -10:
tests/fleet/tamper/sitecustomize.py, loaded only by that board's python wrapper), another (p6, the
largest share) training on flipped labels (y -> 9 - y). The clean fleet is the same fleet's six
honest boards. FedAvg's aggregate falls far below the clean fleet's; multi-Krum (byzantine = 2)
stays within 0.02 of it; the round records, the report and the boards' overview lines flag p6 and
p7. (Against all eight boards repaired, Krum is lower by what the two boards' data was worth:
measured 0.442 vs 0.503 after two rounds, the six honest boards alone 0.442.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.fleet.kit import DATA, local_board, prepare_fleet_data

pytestmark = pytest.mark.slow

SPLIT = DATA / "boards-8"
TAMPER = Path(__file__).resolve().parent / "tamper"
ROUNDS, EPOCHS = 1, 2
ROBUST, SETTINGS = "krum", {"fleet.byzantine": 2}


@pytest.fixture(scope="module")
def groups(flow_home, board_python):
    """``clean6``: boards h0..h5, each with its share of the 8-board non-IID split; ``poisoned8``:
    the same six, p6 (share 6, labels flipped) and p7 (share 7, a tampered agent)."""
    from tasks.board.inventory import save_group

    prepare_fleet_data()
    for i in range(6):
        local_board(flow_home, f"h{i}", SPLIT / f"board-{i}.npz", str(board_python))
    local_board(flow_home, "p6", SPLIT / "board-6.npz", str(board_python), flip=True)
    wrapper = flow_home / "tampered-python.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{TAMPER}"\n'
        "export ODL_TEST_TAMPER_SCALE=-10\n"
        f'exec "{board_python}" "$@"\n'
    )
    os.chmod(wrapper, 0o755)
    local_board(flow_home, "p7", SPLIT / "board-7.npz", str(wrapper))
    save_group("clean6", [f"h{i}" for i in range(6)])
    save_group("poisoned8", [*(f"h{i}" for i in range(6)), "p6", "p7"])


def _run(group: str, strategy: str, overrides: dict | None = None) -> dict:
    from flows.fleet import FleetParams, odl_fleet

    params = FleetParams(group=group, rounds=ROUNDS, epochs=EPOCHS, min_boards=6, strategy=strategy,
                         overrides={"promotion.rollout": False, **(overrides or {})})  # fmt: skip
    state = odl_fleet(params, return_state=True)
    assert state.is_completed(), state.message
    return state.result().summary


def _accuracy(summary: dict) -> float:
    return summary["rounds"][-1]["aggregate"]["accuracy"]


def test_a_robust_strategy_holds_where_fedavg_falls_and_the_bad_boards_are_flagged(prefect_harness, groups):
    from tasks.paths import state_dir

    clean = _run("clean6", "fedavg")
    poisoned = _run("poisoned8", "fedavg")
    robust = _run("poisoned8", ROBUST, SETTINGS)
    figures = {name: _accuracy(s) for name, s in (("clean", clean), ("fedavg", poisoned), (ROBUST, robust))}
    print("aggregate accuracy:", figures)
    assert figures["fedavg"] < figures["clean"] - 0.1, figures
    assert figures[ROBUST] >= figures["clean"] - 0.02, figures
    for rec in poisoned["rounds"] + robust["rounds"]:  # the tampered board: by its norm and direction
        p7, h0 = rec["boards"]["p7"]["update"], rec["boards"]["h0"]["update"]
        assert {"norm", "direction"} <= set(p7["kinds"]) and p7["norm"] > 5 * h0["norm"]
    for rec in robust["rounds"]:  # Krum leaves out exactly the two bad boards: no honest one flagged
        assert rec["outliers"] == ["p6", "p7"], rec["outliers"]
    assert all(not rec["outliers"] for rec in clean["rounds"])
    fleet_md = (state_dir("reports", "digits_fleet-poisoned8") / "fleet.md").read_text()
    assert "**Outlying boards**: p6, p7" in fleet_md and f"Strategy **{ROBUST}**" in fleet_md
    seen = {
        b: json.loads((state_dir("boards-seen") / f"{b}.json").read_text())["fleet"]
        for b in ("p6", "p7", "h0")
    }
    assert seen == {"p6": ["fleet r1: OUTLIER", "left out"], "p7": ["fleet r1: OUTLIER", "norm, direction, left out"],
                    "h0": ["fleet r1: ok"]}  # fmt: skip
