"""A SIGKILLed job resumes from its last checkpoint and ends exactly like an uninterrupted one."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from device_agent.job.events import read_events
from device_agent.ort import load_training_api

EPOCHS = 6  # 13 steps per epoch on the digits recipe (400 samples, batch 32)


def final_weights(jdir) -> dict[str, np.ndarray]:
    api = load_training_api()
    state = api.CheckpointState.load_checkpoint(str(jdir / "checkpoints" / "final"))
    return {name: np.array(p.data) for name, p in state.parameters}


def assert_seq_monotone(jdir) -> list[dict]:
    events = read_events(jdir / "events.jsonl")
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(len(seqs))), "seq must go 0, 1, 2 ... without gaps or duplicates"
    return events


@pytest.mark.slow
def test_sigkill_then_start_matches_uninterrupted_run(agent_board, digits_job):
    ref_spec, files = digits_job("ref", epochs=EPOCHS, checkpoint_every=5)
    ref_dir = agent_board.install(ref_spec, files)
    ref = agent_board.run("run", str(ref_dir))
    assert ref.code == 0, ref.err

    spec, _ = digits_job("killed", epochs=EPOCHS, checkpoint_every=5)
    jdir = agent_board.install(spec, files)
    agent_board.hold("killed", 17)  # killed while it trains, however loaded the machine
    started = agent_board.run("start", str(jdir))
    assert started.code == 0 and started.last["state"] == "running", started.err
    assert agent_board.held_at("killed") == 17
    os.kill(started.last["pid"], signal.SIGKILL)
    status = agent_board.wait("killed", lambda s: s["state"] != "running")
    assert status["state"] == "interrupted" and status["step"] < spec.train.epochs * 13

    agent_board.release("killed")
    again = agent_board.run("start", str(jdir))
    assert again.code == 0, again.err
    status = agent_board.wait("killed", lambda s: s["state"] != "running")
    assert status["state"] == "finished", status
    result = agent_board.run("run", str(jdir)).last  # finished: returns the stored result
    assert result["steps"] == ref.last["steps"] == EPOCHS * 13
    assert result["history"] == ref.last["history"]
    want, got = final_weights(ref_dir), final_weights(jdir)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)

    events = assert_seq_monotone(jdir)
    starts = [e["data"] for e in events if e["type"] == "started"]
    assert len(starts) == 2 and starts[0]["resumed_from_step"] is None
    assert 0 < starts[1]["resumed_from_step"] <= status["step"]
    assert [e["type"] for e in events].count("finished") == 1


def test_finished_job_is_idempotent(agent_board, digits_job):
    spec, files = digits_job("idem", epochs=1)
    jdir = agent_board.install(spec, files)
    first = agent_board.run("run", str(jdir))
    assert first.code == 0, first.err
    size = (jdir / "events.jsonl").stat().st_size
    second = agent_board.run("run", str(jdir))
    assert second.code == 0 and second.last == first.last
    assert (jdir / "events.jsonl").stat().st_size == size, "a finished job must not train again"
    start = agent_board.run("start", str(jdir))
    assert start.code == 0 and start.last["state"] == "finished"
    assert first.last["outputs"]["inference"]["sha256"] and first.last["steps"] == 13
