"""Out of memory on a virtual board whose RAM the kernel caps: the job trains a step and
checkpoints while the board has room, then resumes on the same board brought back up with a
300 MB cap; its next step needs more, the kernel kills it, and the host reports an out-of-memory
failure naming the estimate, the cap and the kept checkpoint, and does not train it again."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest

from tests.agent.test_oom import CAP_MB, _big_batch_data
from tests.fixtures_board import BOARD_VENV, odl_home_env

pytestmark = pytest.mark.slow


def _events(conn, board, job_id):
    from tasks.board.jobs import job_dir

    raw = conn.read_from(f"{job_dir(board, job_id)}/events.jsonl", 0).decode()
    return [line for line in raw.splitlines() if '"type": "started"' in line]


def test_kernel_kill_on_a_capped_board_is_reported_and_not_retried(tmp_path, digits_job, digits_recipe):
    from tasks import stages
    from tasks.board.agent import agent_argv
    from tasks.board.jobs import job_dir, job_status, start_job
    from tasks.board.transport import connect
    from tasks.errors import TrainingFailed
    from tasks.vboard.lifecycle import board_down, board_up

    if os.geteuid() != 0:
        pytest.skip("the virtual board needs root")
    name = f"oom{os.getpid() % 10000}"
    with odl_home_env(tmp_path / "home"):
        board = board_up(name, venv=BOARD_VENV, env={"ODL_AGENT_STEP_DELAY_S": "3"})  # time to cancel
        try:
            spec, files = digits_job("oom-e2e", epochs=1, batch_size=32768, checkpoint_every=1)
            root = tmp_path / "data"
            (root / "blobs").mkdir(parents=True)
            data = _big_batch_data(digits_recipe.data.train, root, 3 * 32768)  # 3 steps
            files[data.blob.sha256] = root / "blobs" / data.blob.sha256
            spec = replace(spec, train_data=data, memory_estimate_mb=50.0)
            stages.deploy(board, spec, files)
            conn = connect(board)
            try:
                from tasks.board.jobs import create_job

                create_job(conn, board, spec)
                start_job(conn, board, spec.job_id)
                for _ in range(600):  # a step or two (checkpointed) with the board's RAM unlimited
                    status = job_status(conn, board, spec.job_id)
                    if status.get("step", 0) >= 1 or status["state"] not in ("running", "pending"):
                        break
                    time.sleep(0.2)
                assert status["state"] == "running" and status["step"] >= 1, status
                conn.run(agent_argv(board, "cancel", job_dir(board, spec.job_id)))
                for _ in range(300):
                    status = job_status(conn, board, spec.job_id)
                    if status["state"] != "running":
                        break
                    time.sleep(0.2)
                assert status["state"] == "cancelled" and 1 <= status["step"] < 3, status
                kept = status["step"]
            finally:
                conn.close()

            board = board_up(name, venv=BOARD_VENV, mem_mb=CAP_MB)  # the same board, now capped
            with pytest.raises(TrainingFailed) as failed:
                stages.train(board, spec, files)
            text = str(failed.value)
            assert "exit 36" in text and "out of memory: the kernel killed the job" in text, text
            assert "estimate was 50 MB" in text and f"lets it use {CAP_MB} MB" in text, text
            assert f"last checkpoint (step {kept}) is kept" in text, text
            conn = connect(board)
            try:
                started = len(_events(conn, board, spec.job_id))
            finally:
                conn.close()
            with pytest.raises(TrainingFailed, match="out of memory"):  # asked again: not trained again
                stages.train(board, spec, files)
            conn = connect(board)
            try:
                assert len(_events(conn, board, spec.job_id)) == started
            finally:
                conn.close()
        finally:
            board_down(name, purge=True)
