"""Two jobs never train on one board: an orphan (its host died) is reattached when it was made
from the same inputs, ended cleanly (cancelled, checkpointed) when not, or refused by a caller
that holds no board slot (issue 13, deliverable 6). Local-transport board, real agent."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tasks.errors import BoardError
from tests.faults.conftest import held_at, hold_job, release_job

pytestmark = pytest.mark.slow


@pytest.fixture
def here(local_board_home, monkeypatch):
    """The local board; a job ``train`` follows is let go (its hold removed) once ``train`` has
    settled what trains there: an orphan held below is reattached while it still trains."""
    import tasks.board.run as board_run
    from tasks.board.inventory import load_inventory

    settle = board_run.settle_orphan

    def settled(conn, board, spec, **kwargs):
        followed = settle(conn, board, spec, **kwargs)
        release_job(conn, board, followed)
        return followed

    monkeypatch.setattr(board_run, "settle_orphan", settled)
    return load_inventory(local_board_home / "inventory.toml")["here"]


def _start_orphan(board, spec, files) -> None:
    """What a killed host leaves: a job started detached, nobody following it. It pauses after its
    first step (the agent's hold hook) until ``train`` settles it, so it is training, past a step,
    whenever the test looks, however loaded the machine."""
    from tasks import stages
    from tasks.board.jobs import create_job, start_job
    from tasks.board.transport import connect

    stages.deploy(board, spec, files)
    conn = connect(board)
    try:
        create_job(conn, board, spec)
        hold_job(conn, board, spec.job_id, 1)
        assert start_job(conn, board, spec.job_id) == "started"
        assert held_at(conn, board, spec.job_id) == 1
    finally:
        conn.close()


def _running(board):
    from tasks.board.orphans import running_job
    from tasks.board.transport import connect

    conn = connect(board)
    try:
        return running_job(conn, board)
    finally:
        conn.close()


def test_same_inputs_reattach_other_inputs_end_it_or_are_refused(here, digits_job):
    from tasks import stages
    from tasks.board.jobs import job_status
    from tasks.board.transport import connect

    tag = str(int(time.time()))
    orphan, files = digits_job(f"orphan-{tag}", epochs=3)
    _start_orphan(here, orphan, files)
    assert _running(here) == orphan.job_id
    # the same inputs under another run's job id: follow the orphan, do not train beside it
    again = dataclasses.replace(orphan, job_id=f"again-{tag}")
    training = stages.train(here, again, files)
    assert training.job_id == orphan.job_id and training.result.status == "finished"

    second, _ = digits_job(f"second-{tag}", epochs=3)
    _start_orphan(here, second, files)  # it has trained a step: ending it must keep its progress
    assert _running(here) == second.job_id
    other, _ = digits_job(f"other-{tag}", epochs=1)
    with pytest.raises(BoardError, match=f"job {second.job_id} is training"):
        stages.train(here, other, files)  # no board slot held (odl run): refused, orphan untouched
    assert _running(here) == second.job_id
    training = stages.train(here, other, files, end_orphans=True)  # the flow: ends it first
    assert training.job_id == other.job_id and training.result.status == "finished"
    conn = connect(here)
    try:
        ended = job_status(conn, here, second.job_id)
    finally:
        conn.close()
    assert ended["state"] == "cancelled" and ended["step"] > 0  # stopped at a step, checkpointed
