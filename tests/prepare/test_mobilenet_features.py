"""The STM32 wiki recipe's host pretraining (recipes/models.py): it stops once it has learnt its
pretext task, says what each phase took, and uses only the cores other work leaves free."""

from __future__ import annotations

import importlib.util
import os
from unittest import mock

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fixtures_prepare import RECIPES


def _models():
    spec = importlib.util.spec_from_file_location("_odl_recipes_models_test", RECIPES / "models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MODELS = _models()
CORES = len(os.sched_getaffinity(0))


def _free(load: float, most: int) -> int:
    with mock.patch.object(os, "getloadavg", lambda: (load, load, load)):
        return MODELS.free_cores(most)


@given(load=st.floats(0, 64), more=st.floats(0, 8), most=st.integers(1, 16))
@example(load=0.0, more=0.0, most=16)  # an idle machine
@example(load=float(CORES), more=0.0, most=16)  # every core busy
def test_free_cores_leaves_busy_cores_alone(load, more, most):
    """Between 1 and the cores the caller allows; every core when idle, one when all are busy, and
    never more threads for more load."""
    got = _free(load, most)
    assert 1 <= got <= min(most, CORES)
    assert _free(load + more, most) <= got
    if load == 0:
        assert got == min(most, CORES)
    if load >= CORES:
        assert got == 1


@pytest.mark.slow
def test_the_pretraining_stops_at_its_target_and_prints_each_phase(tmp_path, monkeypatch, capsys):
    """A reachable target ends at the first check, an unreachable one at max_steps; the lines name the
    steps and the held-out accuracy; torch's thread count is restored."""
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "no-hub"))  # no ImageNet weights
    threads = torch.get_num_threads()
    reached = MODELS.mobilenet_v2_features(tmp_path / "w.pt", size=32, max_steps=60, target=0.0)
    assert reached.startswith(f"a {MODELS.PRETEXT_CHECK_EVERY}-step pretraining"), reached
    assert capsys.readouterr().out.startswith(
        f"  pretraining on generated textures: {MODELS.PRETEXT_CHECK_EVERY} "
    )
    origin = MODELS.mobilenet_v2_features(tmp_path / "w.pt", size=32, max_steps=25, target=1.01)
    lines = capsys.readouterr().out.splitlines()
    assert origin.startswith("a 25-step pretraining on generated textures"), origin
    assert lines[0].startswith("  pretraining on generated textures: 25 steps at 32 px, held-out accuracy ")
    assert len(lines) == 1  # the recipe measures the BatchNorm statistics (trainable.batchnorm_calibration)
    assert torch.get_num_threads() == threads
    state = torch.load(tmp_path / "w.pt", weights_only=True)
    assert state["classifier.1.weight"].shape == (4, 1280)
