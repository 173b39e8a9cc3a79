"""The digits recipe trained on a local board by the agent's autograd runtime (its process unable to
import ``onnxruntime.training``): the same per-step losses and final weights as the ORT runtime, a
SIGKILLed job resumed bit for bit, and the inference model it writes the prepared one with the trained weights."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from device_agent.job.events import read_events
from device_agent.runtimes.state import CheckpointState
from tasks.prepare.board_job import build_job_spec
from tasks.prepare.runtimes.autograd.build import optimizer
from tasks.prepare.runtimes.autograd.template import inference_of
from tests.runtimes.kit import run_job, step_losses, trained

STEPS = 50  # the equivalence: 50 steps, losses within 1e-4 relative, weights within 1e-4
EPOCHS = 6  # 13 steps per epoch (400 samples, batch 32)


@pytest.fixture
def autograd_job(autograd_digits):
    return _job_maker(autograd_digits)


def _job_maker(prepared_recipe):
    recipe, prepared = prepared_recipe

    def make(job_id, **train):
        spec, files = build_job_spec(recipe, prepared, job_id)
        assert spec.runtime == "autograd" and "inference_template" in spec.artifacts
        return replace(spec, train=replace(spec.train, **train)), files

    return make


def test_fifty_steps_match_the_ort_runtime(agent_board, autograd_job, digits_job, no_ort_training):
    spec, files = autograd_job("autograd", max_steps=STEPS, log_every=1)
    jdir, result = run_job(agent_board, spec, files, env=no_ort_training)
    ort_spec, ort_files = digits_job("ort", max_steps=STEPS, log_every=1)
    ort_dir, ort_result = run_job(agent_board, ort_spec, ort_files)
    got, want = np.array(step_losses(jdir)), np.array(step_losses(ort_dir))
    assert len(got) == len(want) == STEPS and result["steps"] == ort_result["steps"] == STEPS
    np.testing.assert_allclose(got, want, rtol=1e-4)
    weights, ort_weights = trained(jdir), trained(ort_dir)
    assert weights.keys() == ort_weights.keys()
    for name, w in ort_weights.items():
        np.testing.assert_allclose(weights[name], w, rtol=0, atol=1e-4, err_msg=name)


def test_the_inference_model_is_the_prepared_one_with_the_trained_weights(agent_board, autograd_job,
                                                                         autograd_digits):  # fmt: skip
    """The template with what it leaves out appended on the board: the trained tensors, and the
    frozen ones the train step holds, each as the exported model has it; the host's own assembly
    of the board's final checkpoint is the same file."""
    _, prepared = autograd_digits
    jdir, result = run_job(agent_board, *autograd_job("inference", epochs=1))
    board = (jdir / "inference.onnx").read_bytes()
    weights = trained(jdir)
    assert set(weights) == set(prepared.manifest["trainable"])
    model = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(prepared.model_onnx)).graph.initializer}
    got = {i.name: numpy_helper.to_array(i) for i in onnx.load_from_string(board).graph.initializer}
    assert set(weights) <= set(got) <= set(model)
    for name, value in got.items():
        np.testing.assert_array_equal(value, weights.get(name, model[name]), err_msg=name)
    host = inference_of(
        prepared.out_dir, prepared.manifest, jdir / "checkpoints" / "final", jdir / "host.onnx"
    )
    assert board == host.read_bytes()
    assert result["outputs"]["inference"]["size"] == len(board)


def _final(jdir) -> CheckpointState:
    return CheckpointState.load_checkpoint(jdir / "checkpoints" / "final")


@pytest.mark.slow
@pytest.mark.parametrize("prepared", ["autograd_digits", "autograd_digits_momentum"])
def test_sigkill_then_start_is_bit_identical(agent_board, prepared, request, no_ort_training):
    """AdamW's moments, or SGD's momentum buffer, come back from the checkpoint bit for bit."""
    pair = request.getfixturevalue(prepared)
    recipe, autograd_job = pair[0], _job_maker(pair)
    ref_spec, files = autograd_job("ref", epochs=EPOCHS, checkpoint_every=5)
    assert json.loads(files[ref_spec.artifacts["step"].sha256].read_text())["optimizer"] == optimizer(recipe)
    ref_dir, ref = run_job(agent_board, ref_spec, files, env=no_ort_training)
    spec, _ = autograd_job("killed", epochs=EPOCHS, checkpoint_every=5)
    jdir = agent_board.install(spec, files)
    agent_board.hold("killed", 17)  # killed while it trains, however loaded the machine
    started = agent_board.run("start", str(jdir), env=no_ort_training)
    assert started.code == 0 and started.last["state"] == "running", started.err
    assert agent_board.held_at("killed") == 17
    os.kill(started.last["pid"], signal.SIGKILL)
    status = agent_board.wait("killed", lambda s: s["state"] != "running")
    assert status["state"] == "interrupted" and status["step"] < EPOCHS * 13

    agent_board.release("killed")
    again = agent_board.run("start", str(jdir), env=no_ort_training)
    assert again.code == 0, again.err
    assert agent_board.wait("killed", lambda s: s["state"] != "running")["state"] == "finished"
    result = agent_board.run("run", str(jdir)).last
    assert result["steps"] == ref["steps"] == EPOCHS * 13 and result["history"] == ref["history"]
    want, got = _final(ref_dir), _final(jdir)
    assert [n for n, _ in want.parameters] == [n for n, _ in got.parameters]
    for name, p in want.parameters:
        assert np.array_equal(got.parameters[name].data, p.data), name
        assert np.array_equal(got.optimizer["m"][name], want.optimizer["m"][name]), name
    assert got.optimizer["step"] == want.optimizer["step"] == EPOCHS * 13
    assert got.optimizer["m"] and all(np.abs(m).max() > 0 for m in got.optimizer["m"].values())
    assert (jdir / "inference.onnx").read_bytes() == (ref_dir / "inference.onnx").read_bytes()
    starts = [e["data"] for e in read_events(jdir / "events.jsonl") if e["type"] == "started"]
    assert len(starts) == 2 and 0 < starts[1]["resumed_from_step"] <= status["step"]
    assert json.loads((jdir / "result.json").read_text())["status"] == "finished"
