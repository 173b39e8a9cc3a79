"""Frozen-prefix caching under the autograd runtime: the digits job trained from the prefix's cached
rows (the split train and eval steps start at the cut) gives the losses, weights and inference model
of the same job trained on the full steps. The recipe is prepared with onnxruntime.training
unimportable (tests/runtimes/conftest.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from device_agent.job.events import read_events
from tasks.prepare.board_job import build_job_spec
from tests.runtimes.kit import run_job, step_losses, trained

STEPS = 26  # two epochs of 13 steps: the second reads every row from the cache


def _job(recipe, prepared, job_id):
    spec, files = build_job_spec(recipe, prepared, job_id)
    return replace(spec, train=replace(spec.train, max_steps=STEPS, log_every=1)), files


def test_cached_prefix_trains_as_the_full_steps(agent_board, autograd_digits, no_ort_training):
    recipe, prepared = autograd_digits
    spec, files = _job(recipe, prepared, "cached")
    assert spec.prefix is not None and spec.prefix.output == prepared.manifest["prefix_cache"]["cut"]
    whole = replace(
        prepared, manifest={**prepared.manifest, "prefix_cache": {"enabled": False, "reason": "test"}}
    )
    full_spec, full_files = _job(recipe, whole, "full")
    assert full_spec.prefix is None and full_spec.artifacts["train_step"] != spec.artifacts["train_step"]
    jdir, result = run_job(agent_board, spec, files, env=no_ort_training)
    full_dir, full_result = run_job(agent_board, full_spec, full_files, env=no_ort_training)
    got, want = np.array(step_losses(jdir)), np.array(step_losses(full_dir))
    assert len(got) == STEPS
    np.testing.assert_allclose(got, want, rtol=1e-5)
    evals = [
        [e["data"]["eval_loss"] for e in read_events(d / "events.jsonl") if e["type"] == "eval"]
        for d in (jdir, full_dir)
    ]
    assert len(evals[0]) == 2
    np.testing.assert_allclose(evals[0], evals[1], rtol=1e-5)
    for name, w in trained(full_dir).items():
        np.testing.assert_allclose(trained(jdir)[name], w, rtol=0, atol=1e-5, err_msg=name)
    caches = [e["data"] for e in read_events(jdir / "events.jsonl") if e["type"] == "cache"]
    assert {c["field"] for c in caches} == {"train_data", "eval_data"}
    assert caches[0]["shape"][1:] == prepared.manifest["prefix_cache"]["feature_shape"][1:]
    # the board writes the whole inference model: the template with the trained weights, as unsplit
    assert result["outputs"]["inference"]["size"] == full_result["outputs"]["inference"]["size"]
