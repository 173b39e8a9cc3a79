"""Learning from what the board sees, end to end (issue 26): two nights of unlabeled shifted digits
appended on the board (beside the labelled clean digits it was delivered with), a teacher labelling
them there before each run of odl/full, the student promoted only through the gate's significance
test and its guard of the clean set; the report shows the teacher's figures.
Collected only by tests/e2e/test_flow_vboard.py, on the virtual board (its real sshd and user)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.flow.test_flow import _artifacts, _run
from tests.flow.test_nightly import _fresh_board_folders, _odl

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "digits_teacher.toml"
DATASET = "datasets/digits-unlabeled"
LABELLED = ("delivered-clean.npz",)  # the 100 clean digits the board was delivered with, labelled


def unlabeled_nights(
    board, recipe_file: Path, dataset: str, nights=(("shard-0001.npz",), ("shard-0002.npz",))
):
    """Prepare the recipe's data, empty its board folders, then per night: append its shards on the
    board (images only, but those named in LABELLED) and run odl/full; (outcome, registry version,
    report) per night."""
    from tasks import stages
    from tasks.judge.report import report_key
    from tasks.recipe.load import load_recipe

    recipe = load_recipe(recipe_file)
    stages.prepare_data(recipe)
    data = Path(recipe.data.test).parent
    _fresh_board_folders(board, (dataset, f"models/{recipe.name}"))
    reg, out = stages.registry(), []
    for shards in nights:
        for shard in shards:
            with np.load(data / "shards" / shard) as z:
                assert z.files == ["x"] or shard in LABELLED, (shard, z.files)  # unlabeled: images only
            assert _odl("data", "push", board.name, str(data / "shards" / shard), "--to", dataset) == 0
        run_id, result = _run(board.name, recipe=str(recipe_file))
        version = next(v for v in reg.versions(recipe.name, board.name) if v.name == result.version)
        out.append((result, version, _artifacts(run_id)[report_key(recipe.name, board.name)].data))
    return out


def test_a_teacher_labels_two_nights_of_unlabeled_board_data(prefect_harness, flow_home, flow_board):
    """Both nights are promoted: a significant gain on the shifted test set each night (p ~1e-12, then
    ~1e-4), the clean set within the gate's tolerance (the clean replay: 0.985 -> 0.98 -> 0.975), on
    every CPU rounding tried (AVX512, AVX2 and the plain kernels, 1 or 2 threads)."""
    from tasks.recipe.load import load_recipe

    board = flow_board
    nights = ((*LABELLED, "shard-0001.npz"), ("shard-0002.npz",))
    (out0, v0, report0), (out1, v1, report1) = unlabeled_nights(board, RECIPE, DATASET, nights)
    unlabeled = v0.info["board_data"]["unlabeled"]
    assert (
        unlabeled["samples"] == 250
        and unlabeled["new_samples"] == 250
        and unlabeled["files"] == ["shard-0001.npz"]
    )
    assert v0.info["board_data"]["new"] == [*LABELLED, "shard-0001.npz"]
    test = out0.metrics
    # the teacher trained to its held-out target (its .fit.json): 0.88-0.89 on this test set under each
    # rounding, a margin of 0.08 below the target no rounding crosses; the student starts at ~0.34
    fit = json.loads(Path(load_recipe(RECIPE).teacher.model).with_suffix(".fit.json").read_text())
    assert fit["score"] >= fit["target"]
    assert test["teacher"]["accuracy"] > fit["target"] - 0.08 > test["base"]["accuracy"] + 0.3
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
    assert bd["new"] == ["shard-0002.npz"] and bd["replayed"] == [*LABELLED, "shard-0001.npz"]
    assert bd["unlabeled"]["new_samples"] == 250 and bd["unlabeled"]["samples"] == 500
    assert "stored labels reused: 1 shard(s)" in report1  # the replayed shard is not labelled twice
    from tasks import stages

    assert out1.promoted, v1.info["reason"]  # the second night gains again, its clean set holds
    served = stages.registry().current("digits_teacher", board.name)
    assert served.name == v1.name and served.metrics["accuracy"] > test["base"]["accuracy"] + 0.3
