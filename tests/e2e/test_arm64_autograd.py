"""digits with ``training.runtime = "autograd"`` through the flow of deployment ``odl/full`` on the
aarch64 virtual board (qemu user mode as a Cortex-A35, plain onnxruntime), and the host's replay of
the same job on x86_64: the board's losses equal the replay's to float32 rounding of another machine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tasks.board.inventory import Board
from tasks.board.jobs import job_dir
from tasks.board.run import drive_job
from tasks.board.transport import connect
from tasks.recipe.load import load_recipe
from tasks.stages.prepare import inputs, job_spec, prepare
from tasks.vboard.boardenv import choose, ensure_env
from tests.fixtures_board import BOARD_ENVS, odl_home_env
from tests.flow.test_flow import _artifacts, _run

pytestmark = [pytest.mark.slow, pytest.mark.board]

DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "digits.toml"
AUTOGRAD = {"training.runtime": "autograd", "training.epochs": 2}
LOSSES = ("loss", "train_loss", "eval_loss")


@pytest.fixture(scope="module")
def arm64_home(arm64_board: Board, virtual_board_home: Path):
    """ODL_HOME pointed at the arm64 board's home (inventory, keys, registry, prepared jobs)."""
    with odl_home_env(virtual_board_home):
        yield virtual_board_home


def test_digits_trains_with_autograd_on_the_aarch64_board_and_matches_the_hosts_replay(
    prefect_harness, arm64_home: Path, arm64_board: Board, tmp_path: Path
) -> None:
    start = time.monotonic()
    run_id, out = _run(arm64_board.name, recipe=str(DIGITS), overrides=AUTOGRAD)
    seconds = time.monotonic() - start
    report = _artifacts(run_id)[f"odl-report-digits-{arm64_board.name}"].data
    assert f"board machine: aarch64, onnxruntime: {arm64_board.ort_version}" in report
    assert out.metrics["candidate"]["accuracy"] > out.metrics["base"]["accuracy"]

    recipe = load_recipe(DIGITS, AUTOGRAD)  # the same job again, by the agent on this x86_64 host
    inp = inputs(recipe)
    spec, files = job_spec(inp, prepare(inp), out.job_id)
    assert spec.runtime == "autograd"
    python = ensure_env(choose("x86_64", "plain"), tmp_path / "unused", BOARD_ENVS).python
    host = Board(name="replay", transport="local", root=str(tmp_path / "odl"), python=python)
    replayed = []
    with connect(host) as conn:
        drive_job(conn, host, spec, files, replayed.append)
    with connect(arm64_board) as conn:
        text = conn.run(["cat", f"{job_dir(arm64_board, out.job_id)}/events.jsonl"]).stdout
    board = _losses(json.loads(line) for line in text.splitlines())
    mine = _losses({"type": e.type, "data": e.data} for e in replayed)
    evals = {k for k in board if k[0] == "eval"}
    assert evals == {k for k in mine if k[0] == "eval"}, sorted(board.keys() ^ mine.keys())[:12]
    assert len(evals) == 2 * AUTOGRAD["training.epochs"]
    both = board.keys() & mine.keys()  # step events are thinned by time: the steps both reported
    assert len(both - evals) >= 3, sorted(board.keys() ^ mine.keys())[:12]
    worst = max(abs(board[k] - mine[k]) / abs(mine[k]) for k in both)
    print(f"aarch64 board, digits autograd through the flow in {seconds:.0f} s: {len(both)} losses, "
          f"largest relative difference to the x86_64 replay {worst:.2g}; reported by one side only: "
          f"{sorted(board.keys() ^ mine.keys())}")  # fmt: skip
    assert worst <= 1e-4


def _losses(events) -> dict[tuple[str, int, str], float]:
    """(event type, step, name) -> loss, of the step and eval events of a job."""
    return {
        (e["type"], int(e["data"]["step"]), key): float(e["data"][key])
        for e in events
        if e["type"] in ("step", "eval")
        for key in LOSSES
        if key in e["data"]
    }
