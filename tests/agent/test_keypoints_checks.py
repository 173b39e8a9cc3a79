"""The board's side of keypoints: its data check accepts COCO labels [N, K, 3] of visibility 0, 1 or 2
and refuses any other visibility in one line naming the input and the sample; its training accuracy is
each image's PCK of the decoded heatmaps or coordinates."""

from __future__ import annotations

import numpy as np
import pytest

from device_agent.data.checks import check_dataset
from device_agent.data.readers import InputSpec
from device_agent.errors import AgentError
from device_agent.job.accuracy import correct_of, count_correct
from device_agent.keypoints import decode, image_pck
from device_agent.protocol import TASKS, ExitCode

INPUTS = [InputSpec("input", (None, 3, 8, 8), np.dtype(np.float32)),
          InputSpec("labels", (None, 5, 3), np.dtype(np.float32))]  # fmt: skip


class Arrays:
    """A dataset as the checks read it: ``arrays`` by input name."""

    def __init__(self, y: np.ndarray) -> None:
        self.arrays = {"input": np.zeros((len(y), 3, 8, 8), np.float32), "labels": y}

    def __len__(self) -> int:
        return len(self.arrays["input"])


def _labels(n: int = 6) -> np.ndarray:
    y = np.zeros((n, 5, 3), np.float32)
    y[..., :2] = np.random.default_rng(0).uniform(0, 8, (n, 5, 2))
    y[..., 2] = np.resize([0.0, 1.0, 2.0], (n, 5))
    return y


def test_keypoints_is_a_board_task_and_coco_labels_pass():
    assert "keypoints" in TASKS
    check_dataset(Arrays(_labels()), INPUTS, "keypoints", None, "train_data")


def test_a_visibility_other_than_0_1_2_is_one_line_naming_the_sample():
    y = _labels()
    y[4, 1, 2] = 3.0
    with pytest.raises(AgentError) as err:
        check_dataset(Arrays(y), INPUTS, "keypoints", None, "train_data")
    assert err.value.code == ExitCode.DATA_MISMATCH
    assert (
        str(err.value)
        == "train_data: input 'labels': keypoint visibility must be 0, 1 or 2, got [3.0] (sample 4)"
    )


def test_labels_of_another_shape_are_refused_by_the_model_input_check():
    with pytest.raises(AgentError, match=r"expected shape \(N, 5, 3\), got \(6, 5, 2\)"):
        check_dataset(Arrays(_labels()[..., :2]), INPUTS, "keypoints", None, "train_data")


def test_the_boards_accuracy_of_keypoints_is_each_images_pck():
    y = _labels(4)
    y[..., 2] = 2
    y[:, :, :2] = [[1.0, 1.0], [7.0, 1.0], [1.0, 7.0], [7.0, 7.0], [4.0, 4.0]]  # a box of side 6
    coords = y[..., :2].copy()
    coords[1, 0, 0] += 0.5  # within 0.1 * 6 of its label
    coords[2, :2] += 3.0  # two of five off
    assert image_pck(coords, y, (8, 8)).tolist() == [1.0, 1.0, 0.6, 1.0]
    assert correct_of("keypoints", coords, y, None, (8, 8)) == pytest.approx(3.6)
    assert count_correct(
        "keypoints", [(coords[:2], y[:2]), (coords[2:], y[2:])], None, (8, 8)
    ) == pytest.approx(3.6)
    heat = np.zeros((1, 1, 4, 4), np.float32)
    heat[0, 0, 3, 1] = 1.0  # cell (row 3, col 1) of a stride-2 heatmap: input point (3, 7)
    assert decode(heat, (8, 8), subpixel=False)[0][0, 0].tolist() == [3.0, 7.0]
