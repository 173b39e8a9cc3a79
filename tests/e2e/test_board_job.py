"""End to end against the virtual board: deploy + train + retrieve the digits recipe, then re-deploy."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from device_agent.protocol import Event
from tasks.board import blobs, jobs, run
from tasks.board.inventory import Board
from tasks.board.retrieve import retrieve
from tasks.board.transport import connect
from tasks.hashing import file_sha256

pytestmark = [pytest.mark.board, pytest.mark.slow]


def assert_events_complete(events: list[Event], job_id: str) -> None:
    """Seqs 0..n-1 each once, one 'started', 'finished' last."""
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.type for e in events].count("started") == 1
    assert events[-1].type == "finished" and {e.job_id for e in events} == {job_id}


def test_deploy_train_retrieve_digits(
    virtual_board: Board, prepared_digits, digits_recipe, tmp_path: Path
) -> None:
    from tasks.prepare.board_job import build_job_spec

    job_id = f"digits-e2e-{os.getpid()}"
    spec, files = build_job_spec(digits_recipe, prepared_digits, job_id)
    events: list[Event] = []
    conn = connect(virtual_board)
    try:
        # the session's board may already hold some blobs (the same data from another test): only
        # the others travel
        blob_dir = f"{virtual_board.root}/blobs"
        conn.run(["rm", "-f", f"{blob_dir}/{spec.train_data.blob.sha256}"])  # at least the data travels
        missing = {sha for sha in files if not conn.exists(f"{blob_dir}/{sha}")}
        report, result = run.drive_job(conn, virtual_board, spec, files, events.append)
        assert missing and sorted(report.uploaded) == sorted(missing)
        assert report.bytes_sent == sum(files[sha].stat().st_size for sha in missing) > 0
        assert sorted(report.skipped) == sorted(set(files) - missing)
        assert result.status == "finished" and result.epochs_done == digits_recipe.training.epochs
        assert_events_complete(events, job_id)
        assert [e.type for e in events].count("epoch") == digits_recipe.training.epochs
        got = retrieve(conn, job_id, result, tmp_path / "out", virtual_board)
        again, same = run.drive_job(conn, virtual_board, spec, files)  # same job id: reattach, no training
        assert again.bytes_sent == 0 and same == result
        second = blobs.upload_blobs(conn, virtual_board, files)  # another job of the same inputs
        assert second.bytes_sent == 0 and sorted(second.skipped) == sorted(files)
        status = jobs.job_status(conn, virtual_board, job_id)
    finally:
        conn.close()
    assert status["state"] == "finished"
    for name, ref in result.outputs.items():
        assert file_sha256(got[name]) == ref.sha256
    assert {"result.json", "events.jsonl", "agent.log"} <= set(got)
    board_events = [Event.from_json(line) for line in got["events.jsonl"].read_text().splitlines()]
    assert [e.seq for e in board_events] == [e.seq for e in events]
    model = got["inference"]
    if spec.prefix is not None:  # the board trained the suffix; the host joins the prefix back
        from tasks.prepare.prefix import stitch

        model = stitch(files[spec.prefix.model.sha256], model, tmp_path / "whole.onnx")
    _check_inference(model, digits_recipe)


def _check_inference(model: Path, recipe) -> None:
    import onnxruntime as ort

    test = np.load(recipe.data.test)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = sess.run(None, {sess.get_inputs()[0].name: test["x"].astype(np.float32)})[0]
    accuracy = float((logits.argmax(1) == test["y"]).mean())
    assert logits.shape == (len(test["y"]), 10) and accuracy > 0.5
