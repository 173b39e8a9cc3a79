"""Equal where both run, with teacher labels: digits_teacher_soft (distillation from the board's
teacher's soft labels) prepared for the autograd runtime with ``onnxruntime.training`` unimportable
trains on the labels the board's teacher gives an unlabeled shard, step for step as the ORT runtime
does (losses 1e-4 relative, final weights 1e-4)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from device_agent.protocol import DataFile, DataRef, file_sha256
from tasks.prepare.board_job import build_job_spec
from tasks.prepare.pipeline import prepare
from tasks.recipe.load import load_recipe
from tasks.stages.prepare import prepare_data
from tests.agent.test_board_nightly import write_shard
from tests.fixtures_prepare import RECIPES
from tests.runtimes.kit import assert_trained_alike, prepared_by_odl

STEPS = 20
SHARDS = "datasets/unlabeled"


def shard_on(board) -> DataRef:
    """One of the recipe's unlabeled shards in the board's datasets, as a DataRef."""
    x = np.load(RECIPES / "data" / "digits-teacher" / "shards" / "shard-0001.npz")["x"]
    folder = board.root / SHARDS
    folder.mkdir(parents=True, exist_ok=True)
    write_shard(folder, "shard-0001.npz", {"x": x})
    path = folder / "shard-0001.npz"
    return DataRef(
        "npz-shards",
        path=SHARDS,
        files=(DataFile(path.name, file_sha256(path), path.stat().st_size, len(x)),),
    )


@pytest.mark.slow
@pytest.mark.ort_training  # the ORT runtime's preparation of digits_teacher_soft.toml (ort-training) is its reference
def test_soft_teacher_labels_train_as_under_the_ort_runtime(tmp_path, agent_board, no_ort_training):
    recipe_file = RECIPES / "digits_teacher_soft.toml"
    recipe = load_recipe(recipe_file)
    prepare_data(recipe)  # the teacher, the student's weights and the shards
    ort_prepared = prepare(recipe, tmp_path / "ort")
    recipe, prepared = prepared_by_odl(
        recipe_file, {"training.runtime": '"autograd"'}, tmp_path / "ag", no_ort_training
    )
    assert prepared.manifest["loss"] == ort_prepared.manifest["loss"]
    assert prepared.manifest["loss"].startswith("distillation")
    data = shard_on(agent_board)
    results, dirs = {}, {}
    for name, prep, env in (("ort", ort_prepared, None), ("autograd", prepared, no_ort_training)):
        spec, files = build_job_spec(recipe, prep, name, train_data=data)
        spec = replace(spec, train=replace(spec.train, max_steps=STEPS, log_every=1))
        dirs[name] = agent_board.install(spec, files)
        run = agent_board.run("run", str(dirs[name]), env=env)
        assert run.code == 0, run.err[-3000:]
        results[name] = run.last
    teacher, ort_teacher = results["autograd"]["teacher"], results["ort"]["teacher"]
    assert (
        ort_teacher["shards_labelled"] == 1 and teacher["shards_reused"] == 1
    )  # the labels the ORT job stored
    assert teacher["kept"] == ort_teacher["kept"] > 200
    assert_trained_alike(dirs["autograd"], dirs["ort"], STEPS)
