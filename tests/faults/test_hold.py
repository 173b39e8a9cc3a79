"""The agent's hold hook (``JOBDIR/hold``): a job pauses after the step the file names, says where
in ``held``, goes on when the file is removed and trains exactly as without the pause; a cancel
ends the pause. The fault tests of tests/e2e inject their faults while a job waits there."""

from __future__ import annotations

import posixpath
import time

from tasks.board import agent, blobs, follow, jobs
from tasks.board.inventory import Board
from tasks.board.transport import LocalTransport
from tests.faults.conftest import board_events, held_at, hold_job, release_job

EPOCHS = 3  # 13 steps per epoch on the digits recipe


def _created(conn: LocalTransport, board: Board, digits_job, job_id: str, hold_at: int):
    spec, files = digits_job(job_id, epochs=EPOCHS)
    blobs.upload_blobs(conn, board, files)
    jdir = jobs.create_job(conn, board, spec)
    hold_job(conn, board, spec.job_id, hold_at)
    return spec, jdir


def test_a_held_job_pauses_at_the_step_and_then_ends_as_an_unheld_one(local_board: Board, digits_job) -> None:
    conn = LocalTransport()
    spec, jdir = _created(
        conn, local_board, digits_job, "held", hold_at=20
    )  # a step with a step event (log_every = 5)
    jobs.start_job(conn, local_board, spec.job_id)
    try:
        assert held_at(conn, local_board, spec.job_id) == 20
        time.sleep(0.5)  # still there: nothing trains while the file exists
        steps = [e.data["step"] for e in board_events(conn, local_board, spec.job_id) if e.type == "step"]
        assert max(steps) == 20 and jobs.job_status(conn, local_board, spec.job_id)["state"] == "running"
    finally:  # never leave a paused agent behind
        release_job(conn, local_board, spec.job_id)
    held = follow.follow_job(conn, local_board, spec.job_id, 0, poll_s=0.05)
    assert not conn.exists(posixpath.join(jdir, "held"))

    deadline = time.monotonic() + 60  # the supervisor lets go of the board lock after result.json
    while jobs.job_status(conn, local_board, spec.job_id)["state"] == "running":
        assert time.monotonic() < deadline, "the held job's process did not end"
        time.sleep(0.05)
    ref_spec, ref_files = digits_job("unheld", epochs=EPOCHS)
    jobs.create_job(conn, local_board, ref_spec)
    jobs.start_job(conn, local_board, ref_spec.job_id)
    ref = follow.follow_job(conn, local_board, ref_spec.job_id, 0, poll_s=0.05)
    assert held.status == ref.status == "finished" and held.steps == ref.steps == EPOCHS * 13
    assert held.history == ref.history


def test_a_cancel_ends_the_pause(local_board: Board, digits_job) -> None:
    conn = LocalTransport()
    spec, jdir = _created(conn, local_board, digits_job, "held-cancel", hold_at=5)
    jobs.start_job(conn, local_board, spec.job_id)
    try:
        assert held_at(conn, local_board, spec.job_id) == 5
    finally:
        conn.run(agent.agent_argv(local_board, "cancel", jdir))
    deadline = time.monotonic() + 60
    while jobs.job_status(conn, local_board, spec.job_id)["state"] == "running":
        assert time.monotonic() < deadline, "cancel not honoured while held"
        time.sleep(0.05)
    result = jobs.read_result(conn, local_board, spec.job_id)
    assert result.status == "cancelled" and result.steps == 5
