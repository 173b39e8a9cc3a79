"""Faults: the link drops during training; the host process is killed mid-run and started again."""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from device_agent.protocol import Event
from tasks.board import jobs, run
from tasks.board.inventory import Board
from tasks.board.transport import connect
from tasks.paths import PROJECT_ROOT
from tests.e2e.test_board_job import assert_events_complete
from tests.fixtures_board import odl_home_env

pytestmark = [pytest.mark.board, pytest.mark.slow]
LONG_EPOCHS = 150  # digits: 13 steps per epoch (~25 s here), long enough to cut the link mid-training
CUT_S = 15


def _board_events(conn, board: Board, job_id: str) -> list[Event]:
    raw = conn.read_from(posixpath.join(jobs.job_dir(board, job_id), "events.jsonl"), 0).decode()
    return [Event.from_json(line) for line in raw.splitlines() if line.strip()]


def test_link_cut_during_training_reconnects_and_loses_nothing(
    virtual_board: Board, virtual_board_home: Path, prepared_digits, digits_recipe, caplog
) -> None:
    from tasks.prepare.board_job import build_job_spec
    from tasks.vboard.faults import set_link

    job_id = f"digits-cut-{os.getpid()}"
    spec, files = build_job_spec(digits_recipe, prepared_digits, job_id)
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, epochs=LONG_EPOCHS))
    events: list[Event] = []
    cut_done = threading.Event()

    def cut_when_training(event: Event) -> None:
        events.append(event)
        if event.type == "step" and not cut_done.is_set():
            cut_done.set()
            threading.Thread(target=_cut, daemon=True).start()

    def _cut() -> None:
        with odl_home_env(virtual_board_home):
            set_link(virtual_board.name, up=False)
            time.sleep(CUT_S)
            set_link(virtual_board.name, up=True)

    caplog.set_level(logging.INFO, logger="tasks.board")
    conn = connect(virtual_board)
    try:
        _, result = run.drive_job(conn, virtual_board, spec, files, cut_when_training)
    finally:
        conn.close()
        with odl_home_env(virtual_board_home):
            set_link(virtual_board.name, up=True)
    assert cut_done.is_set()
    assert "reconnected" in caplog.text
    assert result.status == "finished" and result.epochs_done == LONG_EPOCHS
    assert_events_complete(events, job_id)
    conn = connect(virtual_board)
    try:
        assert [e.seq for e in _board_events(conn, virtual_board, job_id)] == [e.seq for e in events]
    finally:
        conn.close()


def test_killed_host_process_reattaches_instead_of_training_again(
    virtual_board: Board, virtual_board_home: Path, tmp_path: Path
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
        _wait_for_step(conn, virtual_board, job_id, first)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        first.stdout.close()
        killed_at = len(_board_events(conn, virtual_board, job_id))
        second = subprocess.run(argv, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stdout + second.stderr
        events = _board_events(conn, virtual_board, job_id)
    finally:
        conn.close()
    assert "reattaching" in second.stderr
    assert f"job {job_id} on {virtual_board.name}: finished" in second.stdout
    assert "uploaded 0 bytes" in second.stdout
    assert len(events) > killed_at
    assert_events_complete(events, job_id)  # one 'started': the board never trained it twice
    assert (tmp_path / "out" / "inference.onnx").exists()


def _wait_for_step(conn, board: Board, job_id: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"odl run ended early: {proc.stdout.read().decode()[-3000:]}")
        try:
            if any(e.type == "step" for e in _board_events(conn, board, job_id)):
                return
        except Exception:  # noqa: BLE001 - the job dir may not exist yet
            pass
        time.sleep(0.3)
    raise AssertionError("no training step on the board within 300 s")
