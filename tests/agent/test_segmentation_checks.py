"""The board's side of segmentation: its data check accepts [N, H, W] masks of classes or the
ignore index and refuses any other pixel in one line naming it and its sample; its training accuracy
is each image's pixel accuracy, while the classifier's counting is unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_agent.data.checks import check_dataset
from device_agent.data.readers import InputSpec
from device_agent.errors import AgentError
from device_agent.job.accuracy import correct_of, count_correct
from device_agent.protocol import ExitCode

INPUTS = [InputSpec("input", (None, 3, 4, 4), np.dtype(np.float32)),
          InputSpec("labels", (None, 4, 4), np.dtype(np.int64))]  # fmt: skip


class Arrays:
    """A dataset as the checks read it: ``arrays`` by input name."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.arrays = {"input": x, "labels": y}

    def __len__(self) -> int:
        return len(self.arrays["input"])


def _data(y: np.ndarray) -> Arrays:
    return Arrays(np.zeros((len(y), 3, 4, 4), np.float32), y)


def test_masks_of_classes_and_the_ignore_index_pass():
    y = np.random.default_rng(0).integers(0, 3, (5, 4, 4))
    y[:, 0] = 255
    check_dataset(_data(y), INPUTS, "segmentation", 3, "train_data", 255)


@pytest.mark.parametrize(
    ("bad", "ignore", "text"),
    [
        (3, 255, r"must be classes in \[0, 2\] or the ignore index 255, got \[3\] \(sample 2\)"),
        (-100, 255, r"got \[-100\] \(sample 2\)"),
        (255, -100, r"or the ignore index -100, got \[255\] \(sample 2\)"),
    ],
)
def test_any_other_pixel_is_refused_naming_it_and_its_sample(bad, ignore, text):
    y = np.zeros((4, 4, 4), np.int64)
    y[2, 1, 3] = bad
    with pytest.raises(AgentError, match=r"train_data: input 'labels': mask pixels .*" + text) as err:
        check_dataset(_data(y), INPUTS, "segmentation", 3, "train_data", ignore)
    assert err.value.code == ExitCode.DATA_MISMATCH


def test_a_mask_of_another_size_is_refused():
    with pytest.raises(AgentError, match=r"expected shape \(N, 4, 4\), got \(2, 4, 5\)"):
        check_dataset(_data(np.zeros((2, 4, 5), np.int64)), INPUTS, "segmentation", 3, "eval_data", 255)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 4), ignored=st.floats(0, 1))
def test_training_accuracy_is_the_images_pixel_accuracy(seed, n, ignored):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 3, 4, 4)).astype(np.float32)
    y = rng.integers(0, 3, (n, 4, 4))
    y[rng.uniform(size=y.shape) < ignored] = 255
    want = 0.0
    for i in range(n):
        kept = y[i] != 255
        want += float((logits[i].argmax(0) == y[i])[kept].mean()) if kept.any() else 0.0
    assert correct_of("segmentation", logits, y, 255) == pytest.approx(want)
    assert count_correct("segmentation", [(logits, y), (logits, y)], 255) == pytest.approx(2 * want)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 6))
def test_a_classifiers_count_is_its_correct_samples(seed, n):
    rng = np.random.default_rng(seed)
    logits, y = rng.normal(size=(n, 4)), rng.integers(0, 4, n)
    assert count_correct("classification", [(logits, y)]) == int((logits.argmax(1) == y).sum())
    assert isinstance(count_correct("classification", [(logits, y)]), int)
