"""A board's update is checked before it is averaged: same tensors, shapes and dtypes as the global
model, and finite values (one diverged board must not poison the aggregate)."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.errors import FleetError
from tasks.fleet.weights import nbytes, read_update

REF = {"fc.weight": np.zeros((3, 4), np.float32), "fc.bias": np.zeros(3, np.float32)}


def _save(tmp_path, **arrays):
    path = tmp_path / "trainable.npz"
    np.savez(path, **arrays)
    return path


def test_a_matching_update_is_read_back_exactly(tmp_path):
    upd = {"fc.weight": np.ones((3, 4), np.float32), "fc.bias": np.arange(3, dtype=np.float32)}
    got = read_update(_save(tmp_path, **upd), REF, "b1")
    assert all(np.array_equal(got[k], upd[k]) for k in upd) and nbytes(got) == 60


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"fc.weight": np.ones((3, 4), np.float32)}, r"board b1: trainable.npz tensors differ .*fc.bias"),
        (
            {"fc.weight": np.ones((4, 3), np.float32), "fc.bias": np.zeros(3, np.float32)},
            r"float32\[4, 3\], expected float32\[3, 4\]",
        ),
        ({"fc.weight": np.ones((3, 4), np.float64), "fc.bias": np.zeros(3, np.float32)}, "float64"),
        (
            {"fc.weight": np.full((3, 4), np.nan, np.float32), "fc.bias": np.zeros(3, np.float32)},
            "NaN or inf",
        ),
    ],
)
def test_a_wrong_update_is_refused_naming_the_board_and_tensor(tmp_path, arrays, match):
    with pytest.raises(FleetError, match=match):
        read_update(_save(tmp_path, **arrays), REF, "b1")
