"""What the fault tests share: faults run in tracked threads and undone after every test (the board
answers the agent's ``info`` before the next test starts), and the agent's hold hook, which pauses a
job after a known step so that a fault lands while the job certainly still runs."""

from __future__ import annotations

import posixpath
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tasks.board import jobs
from tasks.board.agent import agent_info
from tasks.board.inventory import Board
from tasks.board.transport import connect
from tasks.errors import DeviceError
from tests.fixtures_board import odl_home_env

ANSWER_TIMEOUT_S = 90.0


class Faults:
    """Faults injected into virtual boards during one test, each in its own thread."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.threads: list[threading.Thread] = []
        self.boards: dict[str, Board] = {}
        self.errors: list[BaseException] = []
        self.held: list[tuple[Board, str]] = []

    def hold(self, board: Board, job_id: str, at_step: int) -> None:
        """:func:`hold`, and the job is released (and ended, if it still runs) after the test."""
        self.boards[board.name] = board
        self.held.append((board, job_id))
        hold(board, job_id, at_step)

    def start(self, board: Board, fault: Callable[[], None]) -> threading.Thread:
        """Run ``fault()`` now in a thread (with ODL_HOME set); the board is restored after the test."""
        self.boards[board.name] = board

        def body() -> None:
            try:
                with odl_home_env(self.home):
                    fault()
            except BaseException as exc:  # noqa: BLE001 - reported by restore()
                self.errors.append(exc)

        thread = threading.Thread(target=body, name=f"fault-{board.name}", daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def restore(self) -> None:
        """Wait for every fault to end, undo them (link up, sshd running) and wait until each
        board answers the agent's ``info`` over a new SSH session."""
        from tasks.vboard.faults import restore

        for thread in self.threads:
            thread.join(timeout=120)
            assert not thread.is_alive(), f"fault thread {thread.name} still running after 120 s"
        for board in self.boards.values():
            with odl_home_env(self.home):
                restore(board.name)
            wait_until_answers(board)
        for board, job_id in self.held:  # a test that failed may leave its job paused or running
            _end_job(board, job_id)
        if self.errors:
            raise AssertionError(f"a fault failed: {self.errors[0]!r}") from self.errors[0]


def wait_until_answers(board: Board, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
    """Return once a new connection to ``board`` gets the agent's ``info`` answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = connect(board)
            try:
                agent_info(conn, board)
                return
            finally:
                conn.close()
        except DeviceError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"board {board.name} does not answer after {timeout_s:.0f} s: {exc}"
                ) from exc
            time.sleep(0.5)


@pytest.fixture
def faults(virtual_board_home: Path) -> Iterator[Faults]:
    """Faults of this test, undone (and the boards answering) before the next test starts."""
    kit = Faults(virtual_board_home)
    try:
        yield kit
    finally:
        kit.restore()


def _end_job(board: Board, job_id: str) -> None:
    """Release the job and cancel it if it still runs, so that the board is free for the next test."""
    from tasks.board.agent import agent_argv

    release(board, job_id)
    conn = connect(board)
    try:
        if jobs.job_status(conn, board, job_id).get("state") == "running":
            conn.run(agent_argv(board, "cancel", jobs.job_dir(board, job_id)), check=False)
            wait_for(lambda: jobs.job_status(conn, board, job_id).get("state") != "running", "the cancel", 60)
    finally:
        conn.close()


def _job_file(board: Board, job_id: str, name: str) -> str:
    return posixpath.join(jobs.job_dir(board, job_id), name)


def hold(board: Board, job_id: str, at_step: int) -> None:
    """Ask the job to pause once it has trained ``at_step`` steps (the agent's ``hold`` file)."""
    conn = connect(board)
    try:
        conn.run(["sh", "-c", 'printf %s "$1" > "$2"', "sh", str(at_step), _job_file(board, job_id, "hold")])
    finally:
        conn.close()


def wait_held(board: Board, job_id: str, timeout_s: float = 300.0) -> int:
    """The step at which the job paused (the agent's ``held`` file), once it has."""
    deadline = time.monotonic() + timeout_s
    conn = connect(board)
    try:
        while time.monotonic() < deadline:
            res = conn.run(["cat", _job_file(board, job_id, "held")], check=False)
            if res.code == 0 and res.stdout.strip():
                return int(res.stdout)
            time.sleep(0.1)
    finally:
        conn.close()
    raise AssertionError(f"job {job_id} did not pause within {timeout_s:.0f} s")


def release(board: Board, job_id: str) -> None:
    """Let a paused job go on (removes its ``hold`` file) over a new connection."""
    conn = connect(board)
    try:
        conn.run(["rm", "-f", _job_file(board, job_id, "hold")])
    finally:
        conn.close()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds (AssertionError naming ``what`` past ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.1)
