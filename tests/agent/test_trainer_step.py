"""The step loop's shortcuts keep results exact: accuracy counted over several steps at once, ORT
re-seeded before each step only when the training graph has a random op (and then a resumed
Dropout job still matches an uninterrupted one bit for bit), step lines fsync'd off the loop."""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import replace

import numpy as np

from device_agent.events import EventLog, read_events
from device_agent.ort import load_training_api
from device_agent.trainer import _correct_of, _count_correct, has_random_ops


def test_accuracy_counted_over_several_steps_equals_the_per_step_count():
    rng = np.random.default_rng(0)
    sizes = (16, 16, 7)
    classes = [(rng.standard_normal((n, 5)).astype(np.float32), rng.integers(0, 5, n)) for n in sizes]
    column = [(lg, lb[:, None]) for lg, lb in classes]  # labels as (n, 1)
    binary = [(rng.standard_normal((n, 1)).astype(np.float32), rng.integers(0, 2, (n, 1)).astype(np.float32))
              for n in sizes]  # fmt: skip
    for task, pending in (("classification", classes), ("classification", column), ("binary", binary)):
        assert _count_correct(task, pending) == sum(_correct_of(task, lg, lb) for lg, lb in pending)


def test_random_ops_are_found_in_the_graph_file(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    def model(op: str):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
        path = tmp_path / f"{op}.onnx"
        onnx.save(
            helper.make_model(helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g", [x], [y])), path
        )
        return path

    assert has_random_ops(model("Dropout")) and has_random_ops(model("RandomNormalLike"))
    assert not has_random_ops(model("Relu"))
    assert has_random_ops(tmp_path / "missing.onnx")  # unreadable: seed as if random


def test_dropout_job_resumed_from_a_checkpoint_matches_the_uninterrupted_run(agent_board, tmp_path):
    from tasks.prepare import prepare
    from tasks.prepare.board_job import build_job_spec
    from tests.prepare.kit import tiny_recipe

    recipe = tiny_recipe(tmp_path, {"model": {"callable": "tinymodels:dropout_net"}})
    prepared = prepare(recipe, tmp_path / "prepared", validate=False)
    jobs = {}
    for job_id in ("ref", "resumed"):
        spec, files = build_job_spec(recipe, prepared, job_id)
        spec = replace(spec, train=replace(spec.train, epochs=2, checkpoint_every=4))  # 6 steps an epoch
        jobs[job_id] = agent_board.install(spec, files)
    assert has_random_ops(agent_board.root / "blobs" / spec.artifacts["training_model"].sha256)
    ref = agent_board.run("run", str(jobs["ref"]))
    assert ref.code == 0, ref.err
    (jobs["resumed"] / "checkpoints").mkdir()
    shutil.copy(jobs["ref"] / "checkpoints" / "ckpt-00000008", jobs["resumed"] / "checkpoints")
    again = agent_board.run("run", str(jobs["resumed"]))
    assert again.code == 0, again.err
    assert again.last["history"] == ref.last["history"] and again.last["steps"] == 12

    api = load_training_api()
    weights = [
        {n: np.array(p.data) for n, p in api.CheckpointState.load_checkpoint(str(j / "checkpoints" / "final")).parameters}
        for j in jobs.values()
    ]  # fmt: skip
    for name in weights[0]:
        assert np.array_equal(weights[0][name], weights[1][name]), name


def test_step_lines_are_fsynced_in_the_background_other_events_at_once(tmp_path, monkeypatch):
    import device_agent.events as events

    synced, real = [], os.fsync
    monkeypatch.setattr(events, "STEP_FSYNC_S", 0.01)
    monkeypatch.setattr(
        events.os, "fsync", lambda fd: synced.append(threading.current_thread().name) or real(fd)
    )
    log = EventLog(tmp_path / "events.jsonl", "j")
    log.emit("step", step=1, loss=0.5)
    assert threading.current_thread().name not in synced
    deadline = time.monotonic() + 5
    while "events-fsync" not in synced and time.monotonic() < deadline:
        time.sleep(0.005)
    assert "events-fsync" in synced
    log.emit("epoch", epoch=1)
    assert synced[-1] == threading.current_thread().name
    log.close()
    assert log._syncer is not None and not log._syncer.is_alive()
    assert [e["type"] for e in read_events(tmp_path / "events.jsonl")] == ["step", "epoch"]


def test_rows_gathered_in_chunks_train_exactly_as_one_take_per_step(agent_board, digits_job, monkeypatch):
    """The loop gathers the rows of several steps with one ``take`` (``CHUNK_BYTES``) and slices
    them per step: whatever the chunk (1 step, 5 steps that do not divide the epoch's 13, the
    default), a split digits job with a short last batch trains to the same bits."""
    import signal

    import device_agent.trainer as trainer
    from device_agent.jobdir import JobDir, load_spec
    from device_agent.runner import run_job

    api = load_training_api()
    histories, weights = {}, {}
    handler = signal.getsignal(signal.SIGTERM)
    step_bytes = 32 * (64 + 1) * 4  # digits through the split: 64 float32 features + an int label
    try:
        for label, chunk in (("one", 0), ("five", 5 * step_bytes), ("default", trainer.CHUNK_BYTES)):
            monkeypatch.setattr(trainer, "CHUNK_BYTES", chunk)
            spec, files = digits_job(f"chunk-{label}", epochs=2, checkpoint_every=0)
            path = agent_board.install(spec, files)
            job = JobDir(path, agent_board.root)
            result = run_job(job, load_spec(job))
            assert result.status == "finished", result.error
            histories[label] = result.history
            state = api.CheckpointState.load_checkpoint(str(path / "checkpoints" / "final"))
            weights[label] = {n: np.array(p.data) for n, p in state.parameters}
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert spec.prefix is not None and len(histories["one"]) == 2
    for label in ("five", "default"):
        assert histories[label] == histories["one"], label
        for name, value in weights["one"].items():
            assert np.array_equal(weights[label][name], value), (label, name)
