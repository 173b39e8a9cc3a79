"""The step loop's shortcuts keep results exact: accuracy counted over several steps at once, ORT
re-seeded before each step only when the training graph has a random op (and then a resumed
Dropout job still matches an uninterrupted one bit for bit), step lines fsync'd off the loop."""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import replace

import numpy as np

from device_agent.job.accuracy import correct_of, count_correct
from device_agent.job.events import EventLog, read_events
from device_agent.ort import load_training_api
from device_agent.runtimes.ort_training import has_random_ops


def test_accuracy_counted_over_several_steps_equals_the_per_step_count():
    rng = np.random.default_rng(0)
    sizes = (16, 16, 7)
    classes = [(rng.standard_normal((n, 5)).astype(np.float32), rng.integers(0, 5, n)) for n in sizes]
    column = [(lg, lb[:, None]) for lg, lb in classes]  # labels as (n, 1)
    binary = [(rng.standard_normal((n, 1)).astype(np.float32), rng.integers(0, 2, (n, 1)).astype(np.float32))
              for n in sizes]  # fmt: skip
    for task, pending in (("classification", classes), ("classification", column), ("binary", binary)):
        assert count_correct(task, pending) == sum(correct_of(task, lg, lb) for lg, lb in pending)


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
    from tasks.prepare.board_job import build_job_spec
    from tasks.prepare.pipeline import prepare
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
    import device_agent.job.events as events

    synced, real, in_background = [], os.fsync, threading.Event()

    def fsync(fd: int) -> None:
        name = threading.current_thread().name
        synced.append(name)
        real(fd)
        if name == "events-fsync":
            in_background.set()

    monkeypatch.setattr(events, "STEP_FSYNC_S", 0.01)
    monkeypatch.setattr(events.os, "fsync", fsync)
    log = EventLog(tmp_path / "events.jsonl", "j")
    log.emit("step", step=1, loss=0.5)
    assert threading.current_thread().name not in synced
    assert in_background.wait(timeout=600), "no fsync in the background"  # 600 s: a hang guard only
    log.emit("epoch", epoch=1)
    assert synced[-1] == threading.current_thread().name
    log.close()
    assert log._syncer is not None and not log._syncer.is_alive()
    assert [e["type"] for e in read_events(tmp_path / "events.jsonl")] == ["step", "epoch"]


def test_rows_gathered_in_chunks_train_exactly_as_one_take_per_step(agent_board, digits_job, monkeypatch):
    """The loop gathers the rows of several steps with one ``take`` (``CHUNK_BYTES``) and slices
    them per step: whatever the chunk (1 step, 5 steps that do not divide the epoch's 13, the
    default of a whole digits epoch), a split digits job with a short last batch trains to the
    same bits. The gathers are recorded to show each run chunked as intended."""
    import signal

    import device_agent.job.trainer as trainer
    from device_agent.job.jobdir import JobDir, load_spec
    from device_agent.job.runner import run_job

    api = load_training_api()
    gathers: list[tuple[int, int]] = []  # (rows, bytes) of every gather of the current run
    real_gather, default_bytes = trainer.Trainer._gather, trainer.CHUNK_BYTES

    def recorded(self, idx):
        chunk = real_gather(self, idx)
        gathers.append((len(idx), sum(a.nbytes for a in chunk)))
        return chunk

    monkeypatch.setattr(trainer.Trainer, "_gather", recorded)

    def run(label: str, chunk_bytes: int) -> tuple[list, dict, list[tuple[int, int]]]:
        monkeypatch.setattr(trainer, "CHUNK_BYTES", chunk_bytes)
        gathers.clear()
        spec, files = digits_job(f"chunk-{label}", epochs=2, checkpoint_every=0)
        assert spec.prefix is not None
        path = agent_board.install(spec, files)
        job = JobDir(path, agent_board.root)
        result = run_job(job, load_spec(job))
        assert result.status == "finished", result.error
        state = api.CheckpointState.load_checkpoint(str(path / "checkpoints" / "final"))
        return result.history, {n: np.array(p.data) for n, p in state.parameters}, list(gathers)

    handler = signal.getsignal(signal.SIGTERM)
    try:
        ref_history, ref_weights, one = run("one", 0)
        step_bytes = one[0][1]  # a full batch of the split's inputs
        runs = {"five": run("five", 5 * step_bytes), "default": run("default", default_bytes)}
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert len(ref_history) == 2

    def expected(steps: int) -> list[int]:  # the sizing step, then chunks of ``steps`` over 400 rows
        chunks = lambda start: [min(steps * 32, 400 - r) for r in range(start, 400, steps * 32)]  # noqa: E731
        return [32, *chunks(32), *chunks(0)]

    assert [n for n, _ in one] == expected(1)  # 400 rows: 13 steps an epoch, the last of 16
    assert [n for n, _ in runs["five"][2]] == expected(5) == [32, 160, 160, 48, 160, 160, 80]
    default_steps = min(trainer.PENDING_STEPS, default_bytes // step_bytes)
    assert 1 < default_steps and [n for n, _ in runs["default"][2]] == expected(default_steps)
    for label, (history, weights, _) in runs.items():
        assert history == ref_history, label
        for name, value in ref_weights.items():
            assert np.array_equal(weights[name], value), (label, name)
