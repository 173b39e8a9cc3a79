"""Agent install/upgrade on the virtual board and the compatibility checks of ``info``."""

from __future__ import annotations

import dataclasses
import os
import posixpath
from pathlib import Path

import pytest

from device_agent.protocol import PROTOCOL_VERSION, BoardInfo
from tasks.board import agent
from tasks.board.inventory import Board
from tasks.board.transport import connect
from tasks.errors import DeviceIncompatible
from tests.fixtures_board import BOARD_VENV, odl_home_env

pytestmark = pytest.mark.board


def test_agent_installed_once_and_info_checked(virtual_board: Board) -> None:
    conn = connect(virtual_board)
    stamp = posixpath.join(virtual_board.root, "agent", ".agent-hash")
    try:
        info = agent.install_agent(conn, virtual_board)
        assert (
            info.protocol_version == PROTOCOL_VERSION and info.ort_version == "1.19.2" and info.training_api
        )
        assert info.torch_loaded is False
        assert conn.run(["cat", stamp]).stdout.strip() == agent.agent_hash()
        mtime = conn.run(["stat", "-c", "%Y.%Z", stamp]).stdout
        conn.run(["sh", "-c", "sleep 1.1"])
        agent.install_agent(conn, virtual_board)
        assert conn.run(["stat", "-c", "%Y.%Z", stamp]).stdout == mtime  # unchanged agent: not re-sent
        conn.run(["sh", "-c", 'echo old > "$1"', "sh", stamp])  # an outdated agent is replaced
        agent.install_agent(conn, virtual_board)
        assert conn.run(["cat", stamp]).stdout.strip() == agent.agent_hash()
        with pytest.raises(DeviceIncompatible, match=r"onnxruntime '1\.19\.2', inventory expects 1\.20\.0"):
            agent.install_agent(conn, dataclasses.replace(virtual_board, ort_version="1.20.0"))
    finally:
        conn.close()


def test_check_info_names_each_problem(virtual_board: Board) -> None:
    info = BoardInfo(
        protocol_version=PROTOCOL_VERSION + 1, agent_version="9.0", python_version="3.11.2", numpy_version="2.0",
        ort_version="1.19.2", training_api=False, training_api_error="No module named 'onnxruntime.training'",
        mem_total_mb=4000.0, mem_available_mb=300.0, disk_free_mb=50.0, root=virtual_board.root, cpu_count=2,
        machine="aarch64", torch_loaded=False,
    )  # fmt: skip
    with pytest.raises(DeviceIncompatible) as err:
        agent.check_info(
            virtual_board, info, memory_estimate_mb=900
        )  # no job's runtime: the API is not asked
    msg = str(err.value)
    for part in (f"agent protocol {PROTOCOL_VERSION + 1}, host speaks {PROTOCOL_VERSION}",
                 "needs ~900 MB RAM, board has 300 MB", "only 50 MB free disk"):  # fmt: skip
        assert part in msg
    assert "training API" not in msg
    with pytest.raises(DeviceIncompatible) as err:  # an ORT-training job: that alone, in one line
        agent.check_info(virtual_board, info, memory_estimate_mb=900, runtime="ort-training")
    assert str(err.value) == (f"board {virtual_board.name} (aarch64) has no onnxruntime training API: "
                              'onnxruntime-training has no aarch64 wheel; use [training] runtime = "autograd"')  # fmt: skip
    x86 = dataclasses.replace(info, machine="x86_64", ort_version="1.32.0")
    with pytest.raises(
        DeviceIncompatible, match=r"\(x86_64\) has no .* its onnxruntime 1\.32\.0 is the inference-only"
    ):
        agent.check_info(virtual_board, x86, runtime="ort-training")


@pytest.mark.slow
def test_ram_capped_single_cpu_board_refuses_a_big_job(virtual_board_home: Path) -> None:
    from tasks.vboard.lifecycle import board_down, board_up

    name = f"m{os.getpid()}"
    with odl_home_env(virtual_board_home):
        board = board_up(name, mem_mb=256, cpus=1, venv=BOARD_VENV)  # a kernel RAM cap (cgroup)
    try:
        conn = connect(board)
        try:
            assert f"odl-vboard-{name}" in conn.run(["cat", "/proc/self/cgroup"]).stdout
            assert conn.run(["nproc"]).stdout.strip() == "1"
            info = agent.install_agent(conn, board, memory_estimate_mb=32)
            assert info.mem_limit_mb == 256 and info.mem_total_mb == 256
            assert 32 < info.mem_available_mb < 256  # the cap less what the board's processes use
            with pytest.raises(DeviceIncompatible, match=r"needs ~300 MB RAM, board has \d+ MB available"):
                agent.install_agent(conn, board, memory_estimate_mb=300)
        finally:
            conn.close()
    finally:
        with odl_home_env(virtual_board_home):
            board_down(name, purge=True)
