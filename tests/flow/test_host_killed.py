"""The host dies during a Prefect flow run while the board trains (issue 13, deliverable 6).

A real Prefect server (its lease repossessor on) and ``odl flow`` processes on the local-transport
board: the first flow process is SIGKILLed mid-training and its detached job lives on (paused by the
agent's hold hook until the next run is attached, then it trains on); the next run of the same
inputs waits out the dead run's board slot (its lease lapses), reattaches to that job instead of
training a second one beside it, and records its result. A run of other inputs
ends such an orphan cleanly before its own (tests/nightly/test_orphans.py, without Prefect).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real_server(local_board_home):
    """A Prefect server process (not the test harness: that one never revokes expired leases)."""
    from tasks.stack import server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = server.stack_env(port=port, home=local_board_home)
    env["PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS"] = "2"
    env.update(ODL_AGENT_STEP_DELAY_S="0.1", ODL_BOARD_LEASE_S="60")  # 60 s: Prefect's minimum lease
    # a run refused the board's slot retries within 2 s (Prefect's default grows to 30 s as refusals add up)
    env["PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS"] = "2"
    server.start_server(env)
    try:
        yield env
    finally:
        server.down(local_board_home)


def _board_call(home: Path, fn_name: str, *args):
    from tasks.board.control import agent_json
    from tasks.board.inventory import load_inventory
    from tasks.board.orphans import running_job
    from tasks.board.transport import connect

    board = load_inventory(home / "inventory.toml")["here"]
    conn = connect(board)
    try:
        return {"agent_json": agent_json, "running_job": running_job}[fn_name](conn, board, *args)
    finally:
        conn.close()


def test_next_run_reattaches_to_the_job_a_killed_run_left(real_server, local_board_home, request):
    from tasks.board.inventory import load_inventory
    from tasks.board.jobs import job_dir
    from tasks.judge.registry import Registry

    env, home = real_server, local_board_home
    # the orphan is paused by the agent's hold hook from the kill until the next run has reattached
    # (that run waits out the dead run's lease: 60 s after its last renewal), so it still trains then
    argv = [sys.executable, "-m", "flows.cli", "flow", "recipes/digits.toml", "--board", "here",
            "--epochs", "4"]  # fmt: skip
    board = load_inventory(home / "inventory.toml")["here"]
    with open(home / "killed-flow.log", "wb") as log:
        child = subprocess.Popen(argv, cwd=PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # fmt: skip
        deadline, orphan = time.monotonic() + 240, None
        while orphan is None:
            assert child.poll() is None, (home / "killed-flow.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the flow's job never started training"
            time.sleep(0.2)
            orphan = _board_call(home, "running_job")
        hold = Path(job_dir(board, orphan)) / "hold"
        hold.write_text("")  # empty: the job pauses after its next step
        request.addfinalizer(lambda: hold.unlink(missing_ok=True))  # a failed test leaves no paused job
        held = hold.with_name("held")
        while not held.exists():
            assert time.monotonic() < deadline, "the job did not pause"
            time.sleep(0.1)
        os.killpg(child.pid, signal.SIGKILL)  # the host goes away: nothing of the flow runs again
        child.wait()
    assert _board_call(home, "running_job") == orphan  # detached from its host, it lives on
    reg = Registry(home / "registry")
    before = len(reg.versions("digits", "here"))
    with open(home / "next-flow.log", "wb") as log:
        unbuffered = {**env, "PYTHONUNBUFFERED": "1"}  # its lines read as they come
        second = subprocess.Popen(argv, cwd=PROJECT, env=unbuffered, stdout=log, stderr=subprocess.STDOUT)
        deadline, text = time.monotonic() + 300, ""
        while "reattaching to it instead of starting" not in text:
            assert second.poll() is None, text[-3000:]
            assert time.monotonic() < deadline, f"the next run did not reattach: {text[-3000:]}"
            time.sleep(0.5)
            text = (home / "next-flow.log").read_text()
        assert _board_call(home, "running_job") == orphan  # reattached while the orphan still ran
        hold.unlink()  # the orphan trains on to its end
        assert second.wait(timeout=600) == 0, (home / "next-flow.log").read_text()[-3000:]
    versions = reg.versions("digits", "here")
    assert len(versions) == before + 1 and versions[-1].info["job_id"] == orphan  # its result, recorded
    jobs = _board_call(home, "agent_json", "jobs")["jobs"]
    same_inputs = [j["job_id"] for j in jobs if j["job_id"].startswith(orphan[: len("digits-") + 12])]
    assert same_inputs == [orphan]  # no second job was made from these inputs
    assert next(j for j in jobs if j["job_id"] == orphan)["state"] == "finished"
