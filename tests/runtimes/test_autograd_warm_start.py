"""A nightly warm start under the autograd runtime: the registry's current model (the autograd
base model with every weight scaled) becomes the npz checkpoint the job starts from, through the
frozen-prefix split's checkpoint, and the board trains from those weights, not the base's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tasks import stages
from tasks.checkpoint import autograd_checkpoint, checkpoint_weights
from tasks.judge.registry import Decision, Registry
from tasks.prepare.board_job import build_job_spec
from tasks.stages.warm_start import build_warm_checkpoint
from tests.nightly.test_warm_start import scaled_model
from tests.runtimes.kit import run_job, trained


def test_a_warm_start_trains_from_the_current_version(
    tmp_path, agent_board, autograd_digits, no_ort_training
):
    recipe, prepared = autograd_digits
    assert prepared.manifest["prefix_cache"]["enabled"]  # the warm weights go through the split's checkpoint
    current = scaled_model(stages.base_model(prepared), tmp_path / "current.onnx", 1.5)
    registry = Registry(tmp_path / "registry")
    registry.record("digits", "local", current, {"accuracy": 0.9},
                    Decision(True, "accuracy", 0.9, 0.1, "base", 0.8, 0.0, "test"))  # fmt: skip
    warm = build_warm_checkpoint(
        prepared.checkpoint, registry.current("digits", "local"), tmp_path / "warm" / "ckpt"
    )
    assert autograd_checkpoint(warm.checkpoint) and warm.record["from"] == "v0001"
    spec, files = build_job_spec(recipe, prepared, "warm", checkpoint=warm.checkpoint)
    jdir, _ = run_job(
        agent_board, replace(spec, train=replace(spec.train, max_steps=2)), files, env=no_ort_training
    )
    base, start, got = (
        checkpoint_weights(prepared.checkpoint),
        checkpoint_weights(warm.checkpoint),
        trained(jdir),
    )
    assert set(got) == set(base) == set(prepared.manifest["trainable"])
    moved = [n for n in got if np.abs(base[n]).max() > 0]
    assert len(moved) >= 4
    for name in moved:  # two small steps from 1.5x the base: near the warm weights, far from the base
        np.testing.assert_allclose(start[name], 1.5 * base[name], rtol=1e-6)
        assert np.abs(got[name] - start[name]).max() < 0.25 * np.abs(start[name] - base[name]).max(), name
