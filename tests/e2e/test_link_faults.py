"""Faults: the link drops during training; the host process is killed mid-run and started again."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from device_agent.protocol import Event
from tasks.board import jobs, run
from tasks.board.follow import FollowStats
from tasks.board.inventory import Board
from tasks.board.transport import connect
from tasks.paths import PROJECT_ROOT
from tests.e2e.faultkit import Faults, release, wait_for, wait_held
from tests.e2e.test_board_job import assert_events_complete

pytestmark = [pytest.mark.board, pytest.mark.slow]
LONG_EPOCHS = 150  # digits: 13 steps per epoch; the killed run's job is paused by the hold hook
EPOCHS = 20  # the link-cut job, paused at HOLD_STEP while its link is down
HOLD_STEP = 13
CUT_S = 15


def _board_events(conn, board: Board, job_id: str) -> list[Event]:
    raw = conn.read_from(posixpath.join(jobs.job_dir(board, job_id), "events.jsonl"), 0).decode()
    return [Event.from_json(line) for line in raw.splitlines() if line.strip()]


def test_link_cut_during_training_reconnects_and_loses_nothing(
    virtual_board: Board, faults: Faults, prepared_digits, digits_recipe
) -> None:
    from tasks.board.agent import install_agent
    from tasks.board.blobs import upload_blobs
    from tasks.prepare.board_job import build_job_spec
    from tasks.vboard.faults import set_link

    job_id = f"digits-cut-{os.getpid()}"
    spec, files = build_job_spec(digits_recipe, prepared_digits, job_id)
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, epochs=EPOCHS))
    conn = connect(virtual_board)
    try:
        install_agent(conn, virtual_board)
        upload_blobs(conn, virtual_board, files)
        jobs.create_job(conn, virtual_board, spec)
    finally:
        conn.close()
    faults.hold(virtual_board, job_id, HOLD_STEP)  # the job waits there while the link is down
    stats = FollowStats()

    def cut() -> None:
        assert wait_held(virtual_board, job_id) == HOLD_STEP
        set_link(virtual_board.name, up=False)
        time.sleep(CUT_S)  # past the transport's TCP_USER_TIMEOUT: the follower's read fails
        set_link(virtual_board.name, up=True)
        wait_for(lambda: stats.reconnects >= 1, "the follower reconnecting after the link came back")
        release(virtual_board, job_id)

    events: list[Event] = []
    faults.start(virtual_board, cut)
    conn = connect(virtual_board)
    try:
        _, result = run.drive_job(conn, virtual_board, spec, files, events.append, stats=stats)
    finally:
        conn.close()
    assert stats.reconnects >= 1 and stats.resumes == 0
    assert result.status == "finished" and result.epochs_done == EPOCHS
    assert_events_complete(events, job_id)
    conn = connect(virtual_board)
    try:
        assert [e.seq for e in _board_events(conn, virtual_board, job_id)] == [e.seq for e in events]
    finally:
        conn.close()


def test_killed_host_process_reattaches_instead_of_training_again(
    virtual_board: Board, virtual_board_home: Path, faults: Faults, tmp_path: Path
) -> None:
    from tasks import stages
    from tasks.recipe.load import load_recipe

    recipe_path = PROJECT_ROOT / "recipes" / "digits.toml"
    overrides = {"training.epochs": LONG_EPOCHS}
    job_id = stages.job_id(stages.inputs(load_recipe(recipe_path, overrides)))
    argv = [sys.executable, "-m", "flows.cli", "run", str(recipe_path), "--board", virtual_board.name,
            "--set", f"training.epochs={LONG_EPOCHS}", "--no-validate", "--out", str(tmp_path / "out")]  # fmt: skip
    env = os.environ | {"ODL_HOME": str(virtual_board_home)}
    first = subprocess.Popen(
        argv, env=env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    conn = connect(virtual_board)
    try:
        _wait_for_job(conn, virtual_board, job_id, first)
        faults.hold(virtual_board, job_id, 1)  # pauses at its next step: the run is killed while it trains
        held_at = wait_held(virtual_board, job_id)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        first.stdout.close()
        killed_at = len(_board_events(conn, virtual_board, job_id))
        release(virtual_board, job_id)
        second = subprocess.run(argv, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stdout + second.stderr
        events = _board_events(conn, virtual_board, job_id)
    finally:
        conn.close()
    assert "reattaching" in second.stderr
    assert f"job {job_id} on {virtual_board.name}: finished" in second.stdout
    assert "uploaded 0 bytes" in second.stdout
    assert held_at < LONG_EPOCHS * 13 and len(events) > killed_at
    assert_events_complete(events, job_id)  # one 'started': the board never trained it twice
    assert (tmp_path / "out" / "inference.onnx").exists()


def _wait_for_job(conn, board: Board, job_id: str, proc: subprocess.Popen) -> None:
    """Return once the job's folder holds job.json (``odl run`` has created it)."""
    job_json = posixpath.join(jobs.job_dir(board, job_id), "job.json")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"odl run ended early: {proc.stdout.read().decode()[-3000:]}")
        if conn.exists(job_json):
            return
        time.sleep(0.1)
    raise AssertionError("no job on the board within 300 s")
