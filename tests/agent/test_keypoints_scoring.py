"""The board's PCK is the recipe's: a keypoints job carries ``[keypoints] pck_threshold`` and
``subpixel`` (``job.json``'s ``keypoints``), the trainer's accuracy uses them, a bad value is one
line naming the field, and jobs of other tasks carry nothing new."""

from __future__ import annotations

import numpy as np
import pytest

from device_agent.job.accuracy import correct_of, count_correct
from device_agent.protocol import (
    RUNTIME_ARTIFACTS,
    BlobRef,
    DataRef,
    JobSpec,
    KeypointsScoring,
    SpecError,
    TrainParams,
)
from tasks.paths import PROJECT_ROOT
from tasks.prepare.board_job import _keypoints
from tasks.recipe.load import load_recipe

BLOB = BlobRef("0" * 64, 1)
JOB = JobSpec("kp-1", dict.fromkeys(RUNTIME_ARTIFACTS["ort-training"], BLOB), DataRef("npz", BLOB),
              TrainParams(batch_size=4, epochs=1, lr=1e-3), "keypoints", ("heatmaps",)).to_dict()  # fmt: skip


def _labels_and_guesses() -> tuple[np.ndarray, np.ndarray]:
    """Two images of five keypoints in a box of side 6; each guess 1 pixel off (0.17 of the side)."""
    y = np.zeros((2, 5, 3), np.float32)
    y[..., :2] = [[1.0, 1.0], [7.0, 1.0], [1.0, 7.0], [7.0, 7.0], [4.0, 4.0]]
    y[..., 2] = 2
    guess = y[..., :2].copy()
    guess[:, :, 0] += 1.0
    guess[1, :3, 0] += 2.0  # three of the second image's five are 3 pixels (0.5 of the side) off
    return y, guess


def test_the_trainers_pck_uses_the_jobs_threshold():
    y, guess = _labels_and_guesses()
    assert correct_of("keypoints", guess, y, None, (8, 8)) == 0.0  # 0.1 of 6: none within
    wide = KeypointsScoring(pck_threshold=0.2)
    assert correct_of("keypoints", guess, y, None, (8, 8), wide) == pytest.approx(1.0 + 0.4)
    pending = [(guess[:1], y[:1]), (guess[1:], y[1:])]
    assert count_correct("keypoints", pending, None, (8, 8), KeypointsScoring(0.6)) == pytest.approx(2.0)


def test_a_keypoints_job_carries_the_recipes_scoring():
    recipe = load_recipe(PROJECT_ROOT / "recipes" / "keypoints.toml",
                         {"keypoints.pck_threshold": 0.25, "keypoints.subpixel": False})  # fmt: skip
    scoring = _keypoints(recipe)
    assert scoring == KeypointsScoring(0.25, False)
    job = JobSpec.from_dict(JOB | {"keypoints": scoring.to_dict()})
    assert job.keypoints == scoring and JobSpec.from_json(job.to_json()) == job
    assert _keypoints(load_recipe(PROJECT_ROOT / "recipes" / "segmentation.toml")) is None
    assert "keypoints" not in JobSpec.from_dict(JOB).to_dict()


@pytest.mark.parametrize(
    ("value", "field"),
    [({"pck_threshold": 0.0}, "keypoints.pck_threshold"), ({"pck_threshold": 2}, "keypoints.pck_threshold"),
     ({"subpixel": "yes"}, "keypoints.subpixel"), ({"pck": 0.2}, "keypoints.pck"), (0.2, "keypoints")],
)  # fmt: skip
def test_a_bad_scoring_is_one_line_naming_the_field(value, field):
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict(JOB | {"keypoints": value})
    assert err.value.field == field
