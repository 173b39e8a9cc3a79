"""Validation checks the host data as the board will after the upload (the agent's own check of
every array the training inputs are fed from, against the eval graph): what the board would refuse
stops ``prepare`` with DataError (exit 55) naming the field and file, and leaves no folder."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import DataError, HostExit
from tasks.prepare.pipeline import prepare
from tests.prepare.kit import tiny_recipe


def _write(path, n, **arrays):
    rng = np.random.default_rng(n)
    np.savez(path, x=rng.standard_normal((n, 1, 4, 4)).astype(np.float32), **arrays)


@pytest.fixture
def data(tmp_path):
    (tmp_path / "data").mkdir()
    _write(tmp_path / "data" / "test.npz", 8, y=np.arange(8, dtype=np.int64) % 3)
    return tmp_path / "data"


def test_labels_of_the_wrong_rank_are_the_datas_fault_not_a_failed_train_step(tmp_path, data):
    """y as [N, 1] passes the host's own x/y checks; ORT's cross-entropy (and the board) want [N]:
    before, validation failed in 'train_step' with ORT's 'Invalid rank for input: labels'."""
    recipe = tiny_recipe(tmp_path)
    _write(data / "train.npz", 32, y=(np.arange(32, dtype=np.int64) % 3)[:, None])
    with pytest.raises(DataError) as info:
        prepare(recipe, tmp_path / "out")
    assert str(info.value) == (
        f"data.train ({data / 'train.npz'}): input 'labels': expected 1 dims (N), got shape (32, 1)"
    )
    assert info.value.exit_code == HostExit.DATA and not (tmp_path / "out").exists()


def test_the_eval_set_needs_every_fed_array_and_labels_in_range(tmp_path, data):
    """Labels fed from another array (``[data].feeds``): the eval set, uploaded with the job, must
    hold it, and its labels are checked against the model's classes like y's."""
    recipe = tiny_recipe(tmp_path, {"data": {"eval": "data/eval.npz", "feeds": {"labels": "target"}}})
    labels = np.arange(32, dtype=np.int64) % 3
    _write(data / "train.npz", 32, y=labels, target=labels)
    _write(data / "eval.npz", 16, y=labels[:16])
    with pytest.raises(
        DataError, match=r"^data.eval \(.*eval.npz\): npz has no array 'target' for model input"
    ):
        prepare(recipe, tmp_path / "out")
    _write(data / "eval.npz", 16, y=labels[:16], target=labels[:16] + 1)
    with pytest.raises(DataError, match=r"^data.eval .*labels must be in \[0, 2\] \(model has 3 classes\)"):
        prepare(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()
