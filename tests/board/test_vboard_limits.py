"""The virtual board's kernel limits: a RAM cap (cgroup memory limit, no swap) whose excess the
kernel kills, a CPU quota, a board profile (stm32mp25) whose values explicit ones override, and
what ``info``, ``odl board status`` and ``odl board list`` say about them. Root only (real sshd)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.cli import main
from tasks.board import agent
from tasks.board.inventory import Board
from tasks.board.transport import connect
from tasks.errors import BoardError
from tasks.vboard.profiles import PROFILES, SLOWDOWN, resolve
from tests.fixtures_board import BOARD_VENV, odl_home_env

CAP_MB = 256
# allocate and touch MB megabytes, then report the process's CPU and wall seconds of a busy loop
ALLOC = (
    "import sys; b = bytearray(int(sys.argv[1]) * 2**20); b[::4096] = b'x' * len(b[::4096]); print(len(b))"
)
BUSY = ("import os, time\nt0 = time.monotonic()\nwhile time.monotonic() - t0 < float(os.sys.argv[1]): pass\n"
        "c = os.times()\nprint(c.user + c.system, time.monotonic() - t0)")  # fmt: skip


def test_profile_values_and_explicit_overrides() -> None:
    mp25 = PROFILES["stm32mp25"]
    assert (mp25.mem_mb, mp25.cpus, mp25.cpu_quota) == (4096, 2, 2 / SLOWDOWN) and SLOWDOWN == 8
    native = {"arch": None, "ort": None}
    assert resolve("stm32mp25") == {"mem_mb": 4096, "cpus": 2, "cpu_quota": 0.25, "link": None, **native}
    got = resolve("stm32mp25", mem_mb=512, cpus=None, cpu_quota=0.5, link="delay=5ms")
    assert got == {"mem_mb": 512, "cpus": 2, "cpu_quota": 0.5, "link": "delay=5ms", **native}
    assert resolve(None, mem_mb=None, cpus=1) == {
        "mem_mb": None,
        "cpus": 1,
        "cpu_quota": None,
        "link": None,
        **native,
    }
    arm = resolve("stm32mp25-arm64", ort="plain==1.32.0")  # the board model running aarch64 code under qemu
    assert arm == {
        "mem_mb": 4096,
        "cpus": 2,
        "cpu_quota": None,
        "link": None,
        "arch": "arm64",
        "ort": "plain==1.32.0",
    }
    with pytest.raises(BoardError, match=r"--profile 'stm32mp99': unknown board profile; known: stm32mp25, "):
        resolve("stm32mp99")


def test_unknown_profile_is_refused_by_the_command_line(tmp_path: Path, capsys) -> None:
    with odl_home_env(tmp_path):
        code = main(["board", "up", "--name", "hxnever", "--profile", "mp1"])
    assert code != 0 and "--profile 'mp1'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def capped(virtual_board_home: Path) -> Iterator[Board]:
    """A board of the stm32mp25 profile (2 CPUs, quota 0.25) whose RAM cap is overridden to 256 MB."""
    from tasks.vboard.lifecycle import board_down, board_up

    if os.geteuid() != 0:
        pytest.skip("the virtual board needs root (useradd, ip netns, sshd, cgroups)")
    name = f"cap{os.getpid()}"
    with odl_home_env(virtual_board_home):
        board = board_up(name, profile="stm32mp25", mem_mb=CAP_MB, venv=BOARD_VENV)
    try:
        yield board
    finally:
        with odl_home_env(virtual_board_home):
            board_down(name, purge=True)


def _python(board: Board, source: str, *args: str):
    conn = connect(board)
    try:
        return conn.run([board.python, "-c", source, *args], check=False)
    finally:
        conn.close()


@pytest.mark.board
def test_the_kernel_kills_a_process_over_the_ram_cap(capped: Board, virtual_board_home: Path) -> None:
    from tasks.vboard import cgroup

    with odl_home_env(virtual_board_home):  # a board's cgroup is its project home's (tasks.vboard.owner)
        before = cgroup.memory(capped.name)
    assert before is not None and before["limit_mb"] == CAP_MB
    under = _python(capped, ALLOC, "96")
    assert under.code == 0 and under.stdout.strip() == str(96 * 2**20), under.stderr
    over = _python(capped, ALLOC, str(2 * CAP_MB))
    assert over.code in (137, -9), (over.code, over.stdout, over.stderr)  # SIGKILL (via the shell: 128+9)
    with odl_home_env(virtual_board_home):
        after = cgroup.memory(capped.name)
    assert after["oom_kills"] > before["oom_kills"]  # the cgroup's OOM killer, not a Python MemoryError
    assert "MemoryError" not in over.stderr


@pytest.mark.board
def test_info_reports_the_cap_and_the_host_refuses_a_job_above_it(capped: Board) -> None:
    from tasks.errors import DeviceIncompatible

    conn = connect(capped)
    try:
        info = agent.install_agent(conn, capped)
        assert info.mem_limit_mb == CAP_MB and info.mem_total_mb == CAP_MB
        assert 0 < info.mem_available_mb < CAP_MB
        assert conn.run(["nproc"]).stdout.strip() == "2"  # the profile's CPUs
        # far less than this host has free, more than the board may have: refused before any upload
        with pytest.raises(DeviceIncompatible, match=rf"under its {CAP_MB} MB cgroup limit"):
            agent.install_agent(conn, capped, memory_estimate_mb=CAP_MB + 44)
    finally:
        conn.close()


@pytest.mark.board
def test_cpu_quota_of_the_profile_holds_a_busy_loop_to_a_quarter_cpu(capped: Board) -> None:
    res = _python(capped, BUSY, "2.0")
    assert res.code == 0, res.stderr
    cpu, wall = (float(x) for x in res.stdout.split())
    print(f"busy loop: {cpu:.2f} s CPU in {wall:.2f} s wall")
    assert 0.1 < cpu / wall < 0.45, (cpu, wall)  # the profile's 0.25 CPU (a lone loop gets ~1.0 here)


@pytest.mark.board
def test_status_and_list_show_the_profile(capped: Board, virtual_board_home: Path, capsys) -> None:
    with odl_home_env(virtual_board_home):
        assert main(["board", "status", "--name", capped.name]) == 0
        status = json.loads(capsys.readouterr().out)
        assert main(["board", "list"]) == 0
        listing = capsys.readouterr().out
    assert status["profile"] == "stm32mp25" and status["mem_mb"] == CAP_MB and status["cpus"] == 2
    assert status["cpu_quota"] == status["cpu_quota_now"] == 0.25
    assert status["memory"]["limit_mb"] == CAP_MB
    line = next(ln for ln in listing.splitlines() if ln.startswith(capped.name))
    assert "profile=stm32mp25" in line
