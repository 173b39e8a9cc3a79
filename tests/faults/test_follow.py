"""Following a job whose events.jsonl holds an earlier run's terminal line (cancelled, then resumed),
and one whose training process dies of a signal at the same step twice (issue 53)."""

from __future__ import annotations

import time

import pytest

from device_agent.protocol import Event, ExitCode
from tasks.board import agent, blobs, follow, jobs, run
from tasks.board.inventory import Board
from tasks.board.transport import LocalTransport
from tasks.errors import HostExit, TrainingFailed
from tests.faults.conftest import board_events, held_at, hold_job, release_job
from tests.prepare.crash_kit import EMPTY_BOARD_STEP

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


def test_a_first_death_is_resumed_once_and_a_second_at_the_same_step_fails_in_one_line(
    local_board: Board, crash_job
) -> None:
    """Issue 53: the host restarted a job ONNX Runtime killed (SIGFPE) at the same step three times,
    then said only 'stopped without a result 3 times'. Now the first death is resumed, the second
    at that step is the agent's CRASHED_AGAIN, never retried: the line names the exit code, the
    signal, the step and the batch's samples."""
    conn = LocalTransport()
    spec, files = crash_job("sigfpe-host")
    stats = follow.FollowStats()
    seen: list[Event] = []
    with pytest.raises(TrainingFailed) as info:
        run.drive_job(conn, local_board, spec, files, seen.append, stats=stats)
    assert stats.resumes == 1 and info.value.exit_code == HostExit.TRAINING_FAILED
    assert [e.data["exit_code"] for e in seen if e.type == "failed"] == [
        ExitCode.CRASHED,
        ExitCode.CRASHED_AGAIN,
    ]
    assert str(info.value).startswith(
        f"job sigfpe-host failed (exit {int(ExitCode.CRASHED_AGAIN)}): the training process died of SIGFPE (an "
        f"arithmetic fault: an integer division or remainder by zero) at step {EMPTY_BOARD_STEP} of 8 (epoch 2), "
        "training on samples ["
    ), info.value
    assert "\n" not in str(info.value)


def _events_path(board: Board, job_id: str) -> str:
    return jobs.job_dir(board, job_id) + "/events.jsonl"
