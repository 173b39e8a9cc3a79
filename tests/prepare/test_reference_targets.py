"""Reference models train until held-out data shows their target (recipes/targets.py): the loop stops
at the first epoch that reaches it (never before its minimum), and one that never does stops the
make with one line naming the model, its best figure and its target."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from tasks.errors import DataError
from tests.fixtures_prepare import RECIPES


def _targets():
    spec = importlib.util.spec_from_file_location("_odl_recipes_targets_test", RECIPES / "targets.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


T = _targets()
SCORES = st.lists(st.sampled_from([0.0, 0.5, 0.8, 0.9, 1.0]), min_size=1, max_size=12)


@given(scores=SCORES, value=st.sampled_from([0.5, 0.9, 1.0]), min_epochs=st.integers(1, 6))
@example(scores=[0.9, 0.2], value=0.9, min_epochs=2)  # reached early, lost by the minimum: no stop
@example(scores=[0.2, 0.9], value=0.9, min_epochs=1)
def test_training_stops_at_the_first_epoch_that_reaches_the_target(scores, value, min_epochs):
    model = torch.nn.Linear(1, 1)
    calls, modes = [], []

    def epoch(i: int) -> None:
        modes.append(model.training)
        calls.append(i)

    def score() -> float:
        modes.append(model.training)
        return scores[len(calls) - 1]

    target = T.Target("a model", "accuracy on 3 things", value, max_epochs=len(scores), min_epochs=min_epochs)
    hits = [i for i, s in enumerate(scores) if s >= value and i + 1 >= min_epochs]
    if hits:
        fit = T.train_to_target(model, epoch, score, target)
        assert (
            fit.epochs == hits[0] + 1
            and fit.score == scores[hits[0]]
            and fit.history == scores[: hits[0] + 1]
        )
    else:
        with pytest.raises(DataError) as err:
            T.train_to_target(model, epoch, score, target)
        line = str(err.value)
        assert "\n" not in line and "a model never reached its target" in line
        assert f"{max(scores):.3f} at best (epoch {scores.index(max(scores)) + 1} of {len(scores)})" in line
        assert f"expected >= {value}" in line and "accuracy on 3 things" in line
    assert calls == list(range(len(calls))) and len(calls) == (hits[0] + 1 if hits else len(scores))
    assert modes == [True, False] * len(calls) and not model.training  # trains in train mode, judged in eval


def test_a_classifier_reaches_a_reachable_target_and_records_it(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 2)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    target = T.Target("a line", "accuracy on 64 points", 0.95, max_epochs=50, min_epochs=2)
    fit = T.fit_classifier(
        model, lambda _: (x[:192], y[:192]), (x[192:], y[192:]), target, lr=0.05, decay=0.9
    )
    assert 2 <= fit.epochs < 50 and fit.score >= 0.95
    assert T.accuracy(model, x[192:], y[192:]) == pytest.approx(fit.score, abs=1e-6)
    saved = json.loads(fit.save(tmp_path / "line.pt").read_text())
    assert (tmp_path / "line.fit.json").is_file() and saved["epochs"] == fit.epochs
    assert saved["target"] == 0.95 and saved["history"][-1] == fit.score


def test_a_classifier_that_cannot_reach_its_target_stops_the_make():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 2)).astype(np.float32)
    y = rng.integers(0, 2, 64)  # labels unrelated to x: nothing to learn
    target = T.Target("a guess", "accuracy on 64 points", 0.99, max_epochs=3)
    with pytest.raises(
        DataError, match=r"a guess never reached its target: .* \(epoch \d of 3\), expected >= 0.99"
    ):
        T.fit_classifier(torch.nn.Linear(2, 2), lambda _: (x, y), (x, y), target, lr=0.01)
