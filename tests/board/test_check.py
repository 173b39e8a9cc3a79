"""``odl board check``: the verdicts and thresholds without SSH, the probe through the local transport,
and the whole check against the real virtual board (root only) and through the ``odl`` command."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import os
import posixpath
import subprocess
from pathlib import Path

import pytest

from device_agent.protocol import PROTOCOL_VERSION
from flows.cli import main
from tasks.board import check_clock as clock
from tasks.board import check_items as ci
from tasks.board.agent import install_agent
from tasks.board.check import ITEMS, check_board, exit_code, report, run_probe
from tasks.board.check_probe import cgroup_memory, meminfo
from tasks.board.check_ssh import pinned_keys
from tasks.board.inventory import Board, remove_board, save_board
from tasks.board.transport import connect
from tasks.errors import HostExit
from tests.fixtures_board import odl_home_env

NAMES = ["ssh", *(name for name, *_ in ITEMS), "clock"]
LOCAL = Board(name="here", transport="local", root="/nonexistent/odl")


def statuses(checks: list[ci.Check]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


# ---- pure parts, and the probe through the local transport: no SSH ----


def test_clock_skew_is_corrected_by_half_the_round_trip() -> None:
    assert clock.parse_date("1700000000.250000000\n") == (1700000000.25, 1e-9)
    assert clock.parse_date("1700000000\n") == (1700000000.5, 1.0)  # BusyBox without %N
    assert clock.parse_date("1700000000.N") == (1700000000.5, 1.0)
    with pytest.raises(ValueError):
        clock.parse_date("date: invalid format")
    skew, unc = clock.clock_skew(sent=100.0, received=100.2, board_time=103.1)
    assert skew == pytest.approx(3.0) and unc == pytest.approx(0.1)
    assert clock.clock_skew(100.0, 100.2, 100.5, resolution=1.0)[1] == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("skew", "status"),
    [(0.2, "PASS"), (-0.99, "PASS"), (1.5, "WARN"), (-4.9, "WARN"), (5.1, "FAIL"), (-300, "FAIL")],
)
def test_clock_thresholds(skew: float, status: str) -> None:
    check = clock.judge_clock(skew, 0.01)
    assert check.status == status and ("behind" if skew < 0 else "ahead of") in check.value
    assert status == "PASS" or ("chrony" in check.fix and "timedatectl" in check.fix)
    assert (check.code == HostExit.INCOMPATIBLE) == (status == "FAIL")


def test_ram_thresholds_count_a_cgroup_limit() -> None:
    sec = {"total_mb": 4096.0, "available_mb": 4000.0, "cgroup": None}
    got = [ci.judge_ram({**sec, "available_mb": mb}, LOCAL).status for mb in (4000.0, 700.0, 100.0)]
    assert got == ["PASS", "WARN", "FAIL"]
    cgroup = {"limit_mb": 512.0, "usage_mb": 400.0, "headroom_mb": 112.0, "path": "/sys/fs/cgroup/x"}
    check = ci.judge_ram({**sec, "cgroup": cgroup}, LOCAL)
    assert check.status == "FAIL" and "112 MB available (cgroup limit 512 MB" in check.value
    roomy = {**cgroup, "limit_mb": 1024.0, "headroom_mb": 640.0}
    check = ci.judge_ram({**sec, "cgroup": roomy}, LOCAL)
    assert check.status == "WARN" and "640 MB available (cgroup limit 1024 MB" in check.value


def test_disk_and_write_thresholds() -> None:
    disk = {"root": "/r", "free_mb": 50.0, "total_mb": 8000.0, "writable": True, "error": None}
    assert ci.judge_disk(disk, LOCAL).status == "FAIL"
    assert ci.judge_disk({**disk, "free_mb": 500.0}, LOCAL).status == "WARN"
    assert ci.judge_disk({**disk, "free_mb": 5000.0}, LOCAL).status == "PASS"
    denied = ci.judge_disk({**disk, "free_mb": 5000.0, "writable": False}, LOCAL)
    assert denied.status == "FAIL" and "set root" in denied.fix
    assert ci.judge_write({"mb": 16, "seconds": 32.0}, LOCAL).status == "FAIL"  # 0.5 MB/s
    assert ci.judge_write({"mb": 16, "seconds": 4.0}, LOCAL).status == "WARN"  # 4 MB/s
    assert ci.judge_write({"mb": 16, "seconds": 0.5}, LOCAL).value.startswith("32.0 MB/s")
    assert ci.judge_write({"skipped": "only 70 MB free"}, LOCAL).status == "SKIPPED"


def test_versions_and_agent_protocol() -> None:
    assert ci.version_tuple("2.0.0rc1") == (2, 0, 0) and ci.version_tuple("1.19.2+cpu") == (1, 19, 2)
    old = ci.judge_python({"version": "3.9.18", "executable": "/usr/bin/python3", "machine": "arm"}, LOCAL)
    assert old.status == "FAIL" and ">= 3.10" in old.fix
    assert ci.judge_numpy({"version": "1.15.0"}, LOCAL).status == "FAIL" and ci.board_pin("numpy") != "numpy"
    ort = {"version": "1.19.2", "training_api": True, "training_api_error": ""}
    wrong_inventory = ci.judge_ort(ort, dataclasses.replace(LOCAL, ort_version="1.20.0"))
    assert wrong_inventory.status == "FAIL" and 'set ort_version = "1.19.2"' in wrong_inventory.fix
    newer = ci.judge_ort({**ort, "version": "1.20.0"}, dataclasses.replace(LOCAL, ort_version="1.20.0"))
    assert newer.status == "WARN" and "X-LINUX-AI" in newer.fix
    no_api = ci.judge_training_api({**ort, "training_api": False, "training_api_error": "no api"}, LOCAL)
    assert no_api.status == "FAIL" and "training API" in no_api.fix
    assert ci.judge_agent({"installed": False}, LOCAL, "h").status == "WARN"
    other = ci.judge_agent({"installed": True, "protocol_version": PROTOCOL_VERSION + 1}, LOCAL, "h")
    assert other.status == "FAIL" and "odl board info here" in other.fix


def test_cgroup_limits_v2_and_v1(tmp_path: Path) -> None:
    leaf = tmp_path / "user.slice" / "board"
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text("max\n")
    (leaf / "memory.current").write_text(str(10 * 2**20))
    (leaf.parent / "memory.max").write_text(str(512 * 2**20))
    (leaf.parent / "memory.current").write_text(str(500 * 2**20))
    got = cgroup_memory("0::/user.slice/board\n", str(tmp_path))
    assert got is not None and got["limit_mb"] == 512 and got["headroom_mb"] == 12
    (leaf.parent / "memory.stat").write_text(f"anon 1\ninactive_file {100 * 2**20}\n")  # cache: reclaimable
    got = cgroup_memory("0::/user.slice/board\n", str(tmp_path))
    assert got is not None and got["usage_mb"] == 400 and got["headroom_mb"] == 112
    v1 = tmp_path / "memory" / "docker" / "c1"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(2**30))
    (v1 / "memory.usage_in_bytes").write_text(str(2**28))
    got = cgroup_memory("4:memory:/docker/c1\n0::/\n", str(tmp_path))
    assert got is not None and got["limit_mb"] == 1024 and got["headroom_mb"] == 768
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712")  # v1's "no limit"
    assert cgroup_memory("4:memory:/docker/c1\n", str(tmp_path)) is None
    got = meminfo("MemTotal: 4096000 kB\nMemAvailable: 2048000 kB\n")
    assert got == {"total_mb": 4000.0, "available_mb": 2000.0}


def test_pinned_keys_reads_plain_and_hashed_entries(tmp_path: Path) -> None:
    blob = b"\x00\x00\x00\x0bssh-ed25519" + bytes(36)
    key = base64.b64encode(blob).decode()
    salt = bytes(range(20))
    hashed = base64.b64encode(hmac.new(salt, b"[10.0.0.5]:2222", hashlib.sha1).digest()).decode()
    kh = tmp_path / "known_hosts"
    kh.write_text(
        f"# pinned\n10.0.0.4 ssh-ed25519 {key}\n|1|{base64.b64encode(salt).decode()}|{hashed} ssh-ed25519 {key}\n"
    )
    fingerprint = "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    assert pinned_keys(kh, "10.0.0.4", 22) == [f"ssh-ed25519 {fingerprint}"]
    assert pinned_keys(kh, "10.0.0.5", 2222) == [f"ssh-ed25519 {fingerprint}"]
    assert pinned_keys(kh, "10.0.0.4", 2222) == [] and pinned_keys(tmp_path / "absent", "x", 22) == []


def test_exit_code_is_the_first_failure() -> None:
    checks = [ci.Check("a", "PASS", ""), ci.Check("b", "WARN", "", "do"), ci.fail("c", "", "do"),
              ci.Check("d", "FAIL", "", "do", int(HostExit.HOST_KEY))]  # fmt: skip
    assert exit_code(checks[:2]) == 0 and exit_code(checks) == HostExit.INCOMPATIBLE
    text = report(LOCAL, checks, 1.0).splitlines()
    assert text[1].split() == ["WARN", "b", "->", "fix:", "do"] and text[-1].endswith("2 FAIL in 1.0 s")


def test_probe_on_the_local_transport(board_python: Path, tmp_path: Path) -> None:
    board = Board(name="here", transport="local", root=str(tmp_path / "odl"), python=str(board_python))
    conn = connect(board)
    try:
        sections = run_probe(conn, board)
    finally:
        conn.close()
    assert set(sections) == {"python", "agent", "mem", "disk", "write", "numpy", "ort"}
    assert sections["ort"]["training_api"] and not sections["ort"]["torch_loaded"]
    assert list((tmp_path / "odl").iterdir()) == []  # the 16 MB test file is gone
    subprocess.run([str(board_python), "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    checks = check_board(dataclasses.replace(board, python=str(tmp_path / "bare" / "bin" / "python")))
    assert [c.name for c in checks] == NAMES and statuses(checks)["numpy"] == "FAIL"


# ---- the real virtual board (root only) ----


@pytest.fixture
def installed_board(virtual_board: Board) -> Board:
    """The session's virtual board with the host's agent installed."""
    conn = connect(virtual_board)
    try:
        install_agent(conn, virtual_board)
    finally:
        conn.close()
    return virtual_board


@pytest.fixture
def bare_python(virtual_board: Board) -> str:
    """A python on the virtual board without numpy: a venv (no pip) in the board user's home."""
    path = posixpath.join(posixpath.dirname(virtual_board.root), "bare-venv")
    conn = connect(virtual_board)
    try:
        conn.run([virtual_board.python, "-m", "venv", "--without-pip", path])
    finally:
        conn.close()
    return posixpath.join(path, "bin", "python")


@pytest.mark.board
def test_every_check_passes_on_the_virtual_board(installed_board: Board) -> None:
    virtual_board = installed_board
    checks = check_board(virtual_board)
    assert statuses(checks) == dict.fromkeys(NAMES, "PASS"), report(virtual_board, checks, 0)  # in order
    assert exit_code(checks) == 0 and [c.name for c in checks] == NAMES
    assert "same build as the host" in checks[NAMES.index("agent")].value
    # a root without the agent: the only WARN, and it says how to install it
    fresh = posixpath.join(posixpath.dirname(virtual_board.root), "fresh")
    checks = check_board(dataclasses.replace(virtual_board, root=fresh))
    assert {c.name: c.status for c in checks if c.status != "PASS"} == {"agent": "WARN"}
    assert f"odl board info {virtual_board.name}" in checks[NAMES.index("agent")].fix
    assert exit_code(checks) == 0


@pytest.mark.board
def test_a_python_without_numpy_fails_and_skips_what_needs_it(virtual_board: Board, bare_python: str) -> None:
    checks = check_board(dataclasses.replace(virtual_board, python=bare_python))
    got = statuses(checks)
    assert got["numpy"] == "FAIL" and got["onnxruntime"] == got["training-api"] == "SKIPPED"
    assert all(got[n] == "PASS" for n in ("ssh", "python", "agent", "ram", "disk", "disk-write", "clock"))
    numpy = checks[NAMES.index("numpy")]
    assert "No module named 'numpy'" in numpy.value and "pip install numpy==" in numpy.fix
    assert checks[NAMES.index("onnxruntime")].value == "needs numpy, which failed"
    assert exit_code(checks) == HostExit.INCOMPATIBLE


@pytest.mark.board
def test_a_wrong_or_missing_host_key_fails_ssh_and_skips_the_rest(
    virtual_board: Board, tmp_path: Path
) -> None:
    pinned = Path(virtual_board.known_hosts).read_text().splitlines()  # shared with the session's boards
    entry = virtual_board.host if virtual_board.port == 22 else f"[{virtual_board.host}]:{virtual_board.port}"
    host, key_type, _ = next(line for line in pinned if line.split()[0] == entry).split()
    forged = tmp_path / "forged"
    forged.write_text(
        f"{host} {key_type} AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    checks = check_board(dataclasses.replace(virtual_board, known_hosts=forged))
    ssh = checks[0]
    assert ssh.status == "FAIL" and "CHANGED" in ssh.value and "pinned: ssh-ed25519 SHA256:" in ssh.value
    assert "ssh-keygen -R" in ssh.fix and "ssh-keyscan" in ssh.fix and "console" in ssh.fix
    assert statuses(checks) == {"ssh": "FAIL", **dict.fromkeys(NAMES[1:], "SKIPPED")}
    assert checks[-1].value == "needs ssh, which failed" and exit_code(checks) == HostExit.HOST_KEY
    empty = tmp_path / "empty"
    empty.write_text("")
    unknown = check_board(dataclasses.replace(virtual_board, known_hosts=empty))[0]
    assert unknown.status == "FAIL" and "not pinned" in unknown.value
    assert f"ssh-keyscan -p {virtual_board.port} {virtual_board.host} >> {empty}" in unknown.fix


@pytest.mark.board
def test_odl_board_check_prints_one_line_per_check(
    installed_board: Board, bare_python: str, virtual_board_home: Path, capsys
) -> None:
    virtual_board = installed_board
    with odl_home_env(virtual_board_home):
        save_board(dataclasses.replace(virtual_board, name=f"{virtual_board.name}-np", python=bare_python))
        assert main(["board", "check", virtual_board.name]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split()[:2] for line in lines[:-1]] == [["PASS", n] for n in NAMES]
        assert lines[-1].startswith(f"board {virtual_board.name} (") and "10 PASS" in lines[-1]
        assert main(["board", "check", f"{virtual_board.name}-np", "--json"]) == HostExit.INCOMPATIBLE
        items = json.loads(capsys.readouterr().out)
        assert [i["name"] for i in items] == NAMES and items[2]["status"] == "FAIL" and items[2]["fix"]
        assert main(["board", "check", "no-such-board"]) == HostExit.BOARD
        remove_board(f"{virtual_board.name}-np")


@pytest.mark.board
def test_a_cgroup_memory_limit_fails_the_ram_check(virtual_board_home: Path) -> None:
    """A board whose RAM is capped at 120 MB (``board_up(mem_mb=...)``: a memory cgroup its sshd, and so
    every session, lives in; visible inside its network namespace): below RAM_FAIL_MB."""
    from tasks.vboard.cgroup import cgroup_dir
    from tasks.vboard.lifecycle import board_down, board_up
    from tests.fixtures_board import BOARD_VENV

    if os.geteuid() != 0:
        pytest.skip("needs root and a writable memory cgroup controller")
    name = f"c{os.getpid()}"
    with odl_home_env(virtual_board_home):
        board = board_up(name, mem_mb=120, venv=BOARD_VENV)
        try:
            cgroup = cgroup_dir(name, "memory")
            checks = check_board(board)
        finally:
            board_down(name, purge=True)
    ram = checks[NAMES.index("ram")]
    assert ram.status == "FAIL" and "cgroup limit 120 MB" in ram.value and str(cgroup) in ram.value, ram
    assert "raise the cgroup's memory limit" in ram.fix and exit_code(checks) == HostExit.INCOMPATIBLE
    assert statuses(checks)["training-api"] == "PASS"  # the probe itself still ran inside the limit
