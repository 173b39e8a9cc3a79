"""Learning from what the board sees, end to end (issue 26): two nights of unlabeled shifted digits
appended on the board, a teacher labelling them there before each run of odl/full, the student
promoted only through the gate's significance test; the report shows the teacher's figures.
Collected only by tests/e2e/test_flow_vboard.py, on the virtual board (its real sshd and user)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.flow.test_flow import _artifacts, _run
from tests.flow.test_nightly import _fresh_board_folders, _odl

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "digits_teacher.toml"
DATASET = "datasets/digits-unlabeled"


def unlabeled_nights(board, recipe_file: Path, dataset: str, shards=("shard-0001.npz", "shard-0002.npz")):
    """Prepare the recipe's data, empty its board folders, then per shard: check it holds images
    only, append it on the board and run odl/full; (outcome, registry version, report) per night."""
    from tasks import stages
    from tasks.judge.report import report_key
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(recipe_file)
    stages.prepare_data(recipe)
    data = Path(recipe.data.test).parent
    _fresh_board_folders(board, (dataset, f"models/{recipe.name}"))
    reg, nights = stages.registry(), []
    for shard in shards:
        with np.load(data / "shards" / shard) as z:
            assert z.files == ["x"]  # the board gets images only
        assert _odl("data", "push", board.name, str(data / "shards" / shard), "--to", dataset) == 0
        run_id, out = _run(board.name, recipe=str(recipe_file))
        version = next(v for v in reg.versions(recipe.name, board.name) if v.name == out.version)
        nights.append((out, version, _artifacts(run_id)[report_key(recipe.name, board.name)].data))
    return nights


def test_a_teacher_labels_two_nights_of_unlabeled_board_data(prefect_harness, flow_home, flow_board):
    board = flow_board
    (out0, v0, report0), (out1, v1, report1) = unlabeled_nights(board, RECIPE, DATASET)
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
        "### Teacher confidence (top-class probability" in report0
        and "### Classes of the kept labels" in report0
    )
    assert "| metric | teacher | base | candidate |" in report0  # the teacher's accuracy beside the student's

    assert v1.info["start_from"]["from"] == v0.name
    bd = v1.info["board_data"]
    assert bd["new"] == ["shard-0002.npz"] and bd["replayed"] == ["shard-0001.npz"]
    assert bd["unlabeled"]["new_samples"] == 250 and bd["unlabeled"]["samples"] == 500
    assert "stored labels reused: 1 shard(s)" in report1  # the replayed shard is not labelled twice
    from tasks import stages

    served = stages.registry().current("digits_teacher", board.name)
    assert served.metrics["accuracy"] > test["base"]["accuracy"] + 0.2  # two nights, no label on the board
