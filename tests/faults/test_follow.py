"""Following a job whose events.jsonl holds an earlier run's terminal line (cancelled, then resumed)."""

from __future__ import annotations

import time

import pytest

from device_agent.protocol import Event
from tasks.board import agent, blobs, follow, jobs, run
from tasks.board.inventory import Board
from tasks.board.transport import LocalTransport
from tests.faults.conftest import board_events, held_at, hold_job, release_job

EPOCHS = 4  # 13 steps per epoch on the digits recipe


def _cancel_while_held(conn: LocalTransport, board: Board, job_id: str) -> None:
    """Start the job and cancel it while it is paused after step 5 (the hold hook: the cancel cannot
    come after the job ended); once it has stopped, a later run of it no longer pauses."""
    hold_job(conn, board, job_id, 5)
    jobs.start_job(conn, board, job_id)
    try:
        assert held_at(conn, board, job_id) == 5
    finally:
        conn.run(agent.agent_argv(board, "cancel", jobs.job_dir(board, job_id)))
    deadline = time.monotonic() + 120
    while jobs.job_status(conn, board, job_id)["state"] == "running":
        assert time.monotonic() < deadline, "cancel not honoured within 120 s"
        time.sleep(0.05)
    release_job(conn, board, job_id)


@pytest.mark.parametrize("offset", ["zero", "after-terminal"])
def test_follow_after_resume_skips_the_stale_terminal_event(
    local_board: Board, digits_job, offset: str
) -> None:
    conn = LocalTransport()
    spec, files = digits_job(f"stale-{offset}", epochs=EPOCHS)
    blobs.upload_blobs(conn, local_board, files)
    jobs.create_job(conn, local_board, spec)
    _cancel_while_held(conn, local_board, spec.job_id)
    before = board_events(conn, local_board, spec.job_id)
    assert before[-1].type == "cancelled"
    assert jobs.read_result(conn, local_board, spec.job_id).status == "cancelled"

    assert jobs.start_job(conn, local_board, spec.job_id) == "started"
    seen: list[Event] = []
    start = 0 if offset == "zero" else len(conn.read_from(_events_path(local_board, spec.job_id), 0))
    result = follow.follow_job(conn, local_board, spec.job_id, start, seen.append, poll_s=0.05)
    assert result.status == "finished" and result.steps == EPOCHS * 13
    assert seen[-1].type == "finished"
    resumed = [e for e in seen if e.type == "started" and e.data.get("resumed_from_step")]
    assert resumed and resumed[-1].data["resumed_from_step"] == before[-1].data["step"]


def test_drive_job_resumes_a_cancelled_job_instead_of_reporting_it(local_board: Board, digits_job):
    conn = LocalTransport()
    spec, files = digits_job("rerun-cancelled", epochs=EPOCHS)
    blobs.upload_blobs(conn, local_board, files)
    jobs.create_job(conn, local_board, spec)
    _cancel_while_held(conn, local_board, spec.job_id)
    report, result = run.drive_job(conn, local_board, spec, files)
    assert report.bytes_sent == 0
    assert result.status == "finished" and result.steps == EPOCHS * 13


def _events_path(board: Board, job_id: str) -> str:
    return jobs.job_dir(board, job_id) + "/events.jsonl"
