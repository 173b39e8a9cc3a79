"""Learning from what the board sees, end to end (issue 26): two nights of unlabeled shifted digits
appended on the board, a teacher labelling them there before each run of odl/full, the student
promoted only through the gate's significance test; the report shows the teacher's figures.
tests/e2e/test_flow_vboard.py runs it on the virtual board."""

from __future__ import annotations

import posixpath
from pathlib import Path

import numpy as np
import pytest

from tests.flow.test_flow import _artifacts, _run
from tests.flow.test_nightly import _odl

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "digits_teacher.toml"
DATASET = "datasets/digits-unlabeled"


def _fresh(board) -> None:
    from tasks.board.transport import connect

    conn = connect(board)
    try:
        for sub in (DATASET, "models/digits_teacher"):
            conn.run(["rm", "-rf", posixpath.join(board.root, sub)])
    finally:
        conn.close()


def test_a_teacher_labels_two_nights_of_unlabeled_board_data(prefect_harness, flow_home, flow_board):
    from tasks import stages
    from tasks.recipe.load import load_recipe

    board = flow_board
    recipe = load_recipe(RECIPE)
    stages.prepare_data(recipe)
    data = RECIPE.parent / "data" / "digits-teacher"
    for shard in ("shard-0001.npz", "shard-0002.npz"):  # the board gets images only
        with np.load(data / "shards" / shard) as z:
            assert z.files == ["x"]
    _fresh(board)
    reg = stages.registry()

    def night(shard: str):
        assert _odl("data", "push", board.name, str(data / "shards" / shard), "--to", DATASET) == 0
        run_id, out = _run(board.name, recipe=str(RECIPE))
        version = next(v for v in reg.versions("digits_teacher", board.name) if v.name == out.version)
        report = _artifacts(run_id)[f"odl-report-digits-teacher-{board.name}"].data
        return out, version, report

    out0, v0, report0 = night("shard-0001.npz")
    unlabeled = v0.info["board_data"]["unlabeled"]
    assert (
        unlabeled["samples"] == 250
        and unlabeled["new_samples"] == 250
        and unlabeled["files"] == ["shard-0001.npz"]
    )
    test = out0.metrics
    assert test["teacher"]["accuracy"] > 0.85 > test["base"]["accuracy"] + 0.3  # teacher 0.89, student 0.30
    assert out0.promoted, v0.info["reason"]
    sig = v0.info["decision"]["significance"]
    assert sig["significant"] and sig["p_value"] < 0.05
    assert (
        "## Teacher labels (on the board)" in report0
        and "unlabeled on the board for this run: 250 samples" in report0
    )
    assert (
        "### Teacher confidence (top-class probability)" in report0
        and "### Classes of the kept labels" in report0
    )
    assert "| teacher |" in report0 or "teacher" in report0.split("## Before / after")[1].splitlines()[2]

    out1, v1, report1 = night("shard-0002.npz")
    assert v1.info["start_from"]["from"] == v0.name
    bd = v1.info["board_data"]
    assert bd["new"] == ["shard-0002.npz"] and bd["replayed"] == ["shard-0001.npz"]
    assert bd["unlabeled"]["new_samples"] == 250 and bd["unlabeled"]["samples"] == 500
    assert "stored labels reused: 1 shard(s)" in report1  # the replayed shard is not labelled twice
    served = reg.current("digits_teacher", board.name)
    assert served.metrics["accuracy"] > test["base"]["accuracy"] + 0.2  # two nights, no label on the board
