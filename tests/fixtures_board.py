"""Fixtures of the board area: a board on this machine through the local transport (no root), and a
real virtual board (private sshd, own user, own netns; root only).

``local_board`` is a fresh agent root in a tmp folder with the agent installed, reached through
``transport = "local"`` exactly as the pipeline reaches any board.

``virtual_board`` yields the :class:`tasks.board.inventory.Board` of a board brought up for this test
session (unique name per session, purged at the end); ``virtual_board_home`` is the ODL_HOME that
holds its inventory, keys and pinned known_hosts (set ``ODL_HOME`` to it to use the board by name).
``shaped_virtual_board`` is another such board behind a slow, lossy link (``SHAPED_LINK``).
``arm64_board`` runs aarch64 code: an arm64 Debian userland under qemu user mode with the plain
onnxruntime of ``deploy/board-requirements-plain.txt`` (its first version), built once into
``BOARD_ENVS`` and kept between sessions like ``BOARD_VENV``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.vboard.venv import shared_board_venv

# The board venv (numpy + onnxruntime-training-cpu) is kept between sessions, one per content of
# deploy/board-requirements.txt and constraints.txt (shared with bench/: tasks.vboard.venv)
BOARD_VENV = shared_board_venv()
# The other board environments (plain onnxruntime on x86_64, the arm64 userlands): tasks.vboard.boardenv
BOARD_ENVS = Path(os.environ.get("ODL_TEST_BOARD_ENVS", "/var/tmp/odl-test-board-envs"))


@contextlib.contextmanager
def odl_home_env(home: Path) -> Iterator[None]:
    """Temporarily point ``ODL_HOME`` at ``home``."""
    old = os.environ.get("ODL_HOME")
    os.environ["ODL_HOME"] = str(home)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ODL_HOME", None)
        else:
            os.environ["ODL_HOME"] = old


@pytest.fixture(scope="session")
def virtual_board_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ODL_HOME of the session's virtual board (inventory.toml, known_hosts, boards/NAME)."""
    return tmp_path_factory.mktemp("odl-board-home")


@pytest.fixture(scope="session")
def virtual_board(virtual_board_home: Path) -> Iterator:
    """A virtual board for the whole session; torn down (user, netns, sshd) at the end."""
    from tasks.vboard.lifecycle import board_down, board_up

    if os.geteuid() != 0:
        pytest.skip("the virtual board needs root (useradd, ip netns, sshd)")
    name = f"t{os.getpid()}"
    with odl_home_env(virtual_board_home):
        board = board_up(name, venv=BOARD_VENV)
    try:
        yield board
    finally:
        with odl_home_env(virtual_board_home):
            board_down(name, purge=True)


@contextlib.contextmanager
def session_board(home: Path, name: str, **up: object) -> Iterator:
    """A virtual board ``name`` of ``home`` brought up with ``board_up(**up)`` (environments cached in
    BOARD_ENVS) and purged when the block ends."""
    from tasks.vboard.lifecycle import board_down, board_up

    if os.geteuid() != 0:
        pytest.skip("the virtual board needs root (useradd, ip netns, sshd)")
    with odl_home_env(home):
        board = board_up(name, envs=BOARD_ENVS, **up)  # type: ignore[arg-type]
    try:
        yield board
    finally:
        with odl_home_env(home):
            board_down(name, purge=True)


@pytest.fixture(scope="session")
def arm64_board(virtual_board_home: Path) -> Iterator:
    """An aarch64 virtual board for the session (qemu user mode as a Cortex-A35, plain onnxruntime)."""
    with session_board(virtual_board_home, f"a{os.getpid()}", arch="arm64") as board:
        yield board


# The slow link: 10 Mbit/s each way, 50 ms each way, 1% of the packets lost (tasks.vboard.link)
SHAPED_LINK = "rate=10mbit,delay=50ms,loss=1%"


@pytest.fixture(scope="session")
def shaped_virtual_board(virtual_board_home: Path) -> Iterator:
    """A second virtual board for the session, reached over ``SHAPED_LINK`` (through its delay proxy),
    with the agent installed (~10 s over this link: the agent goes file by file, ~3 round trips each)."""
    from tasks.board.agent import install_agent
    from tasks.board.transport import connect
    from tasks.vboard.lifecycle import board_down, board_up

    if os.geteuid() != 0:
        pytest.skip("the virtual board needs root (useradd, ip netns, sshd, tc, nft)")
    name = f"s{os.getpid()}"
    with odl_home_env(virtual_board_home):
        board = board_up(name, venv=BOARD_VENV, link=SHAPED_LINK)
    try:
        conn = connect(board)
        try:
            install_agent(conn, board)
        finally:
            conn.close()
        yield board
    finally:
        with odl_home_env(virtual_board_home):
            board_down(name, purge=True)


@pytest.fixture
def local_board(board_python: Path, tmp_path: Path):
    """A board whose root is a tmp folder on this machine, with the agent installed as on a board."""
    from tasks.board.agent import install_agent
    from tasks.board.inventory import Board
    from tasks.board.transport import connect

    board = Board(name="local", transport="local", root=str(tmp_path / "odl"), python=str(board_python))
    conn = connect(board)
    try:
        install_agent(conn, board)
    finally:
        conn.close()
    return board


def make_local_home(home: Path, board_python: Path) -> Path:
    """``home`` made an ODL_HOME whose inventory names one local-transport board, ``here``, rooted in it."""
    from tasks.board.inventory import Board, save_board

    root = home / "board-root"
    save_board(Board(name="here", transport="local", root=str(root), python=str(board_python)),
               home / "inventory.toml")  # fmt: skip
    return home


@pytest.fixture(scope="session")
def local_board_home(tmp_path_factory: pytest.TempPathFactory, board_python: Path) -> Path:
    """An ODL_HOME whose inventory names one local-transport board, ``here``."""
    return make_local_home(tmp_path_factory.mktemp("odl-local-home"), board_python)
