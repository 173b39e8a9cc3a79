"""SSH transport and virtual board against a real sshd: quoting, host keys, dead hosts, inventory."""

from __future__ import annotations

import dataclasses
import posixpath
import secrets
import socket
from pathlib import Path

import pytest

from tasks.board.inventory import Board, get_board, load_inventory, save_board
from tasks.board.transport import LocalTransport, connect, quote_argv
from tasks.errors import BoardError, DeviceUnreachable, HostKeyRejected
from tests.board.contract import TransportContract
from tests.fixtures_board import odl_home_env

pytestmark = pytest.mark.board


def test_runs_as_unprivileged_user_in_its_own_namespace(virtual_board: Board) -> None:
    conn = connect(virtual_board)
    try:
        assert conn.run(["id", "-un"]).stdout.strip() == virtual_board.user
        assert conn.run(["id", "-u"]).stdout.strip() != "0"
        assert (
            conn.run(
                [virtual_board.python, "-c", "import onnxruntime, numpy; print(onnxruntime.__version__)"]
            ).stdout.strip()
            == "1.19.2"
        )
        has_torch = conn.run([virtual_board.python, "-c", "import torch"], check=False)
        assert has_torch.code != 0
    finally:
        conn.close()


def test_changed_host_key_is_refused(virtual_board: Board, tmp_path: Path) -> None:
    pinned = Path(virtual_board.known_hosts).read_text().splitlines()
    entry = next(line for line in pinned if line.startswith((virtual_board.host, f"[{virtual_board.host}]")))
    host, key_type, _ = entry.split()
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    forged = tmp_path / "known_hosts"
    forged.write_text(f"{host} {key_type} {other}\n")
    with pytest.raises(HostKeyRejected, match="CHANGED"):
        connect(dataclasses.replace(virtual_board, known_hosts=forged))


def test_unknown_host_is_refused(virtual_board: Board, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyRejected, match="not in"):
        connect(dataclasses.replace(virtual_board, known_hosts=empty))
    with pytest.raises(HostKeyRejected, match="no pinned known_hosts"):
        connect(dataclasses.replace(virtual_board, known_hosts=tmp_path / "absent"))


def test_closed_port_is_unreachable_and_retryable(virtual_board: Board) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DeviceUnreachable) as info:
        connect(dataclasses.replace(virtual_board, host="127.0.0.1", port=port, connect_timeout=2))
    assert info.value.retryable


@pytest.mark.parametrize("link", ["direct", "shaped"])
def test_put_get_exists_read_from(request: pytest.FixtureRequest, link: str, tmp_path: Path) -> None:
    # "shaped": the same transfers over 10 Mbit/s, 50 ms each way and 1% packet loss (~6 s)
    virtual_board = request.getfixturevalue("virtual_board" if link == "direct" else "shaped_virtual_board")
    src = tmp_path / "src.bin"
    src.write_bytes(secrets.token_bytes(3_000_000))
    remote = f"{posixpath.dirname(virtual_board.root)}/scratch-{secrets.token_hex(3)}.bin"
    conn = connect(virtual_board)
    try:
        conn.put(src, remote)
        assert conn.exists(remote)
        conn.get(remote, tmp_path / "back.bin")
        assert conn.read_from(remote, 2_999_990) == src.read_bytes()[2_999_990:]
        assert conn.read_from(remote + ".absent", 0) == b""
        conn.run(["rm", remote])
    finally:
        conn.close()
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()


def test_board_up_is_idempotent(virtual_board: Board, virtual_board_home: Path) -> None:
    from tasks.vboard.lifecycle import board_status, board_up

    with odl_home_env(virtual_board_home):
        before = board_status(virtual_board.name)
        again = board_up(virtual_board.name)
        after = board_status(virtual_board.name)
        assert get_board(virtual_board.name) == virtual_board
    assert again == virtual_board
    assert before["running"] and after["running"]


def test_inventory_round_trip_and_errors(tmp_path: Path) -> None:
    inv = tmp_path / "inventory.toml"
    board = Board(
        name="mp2-lab",
        host="192.168.1.40",
        user="odl",
        key=tmp_path / "k",
        root="/home/odl/odl",
        known_hosts=tmp_path / "kh",
    )
    save_board(board, inv)
    assert load_inventory(inv) == {"mp2-lab": board}
    with pytest.raises(BoardError, match="not in .*known boards: mp2-lab"):
        get_board("other", inv)
    inv.write_text('[boards.x]\nhost = "h"\nuser = "u"\nkey = "k"\nroot = "/r"\nport = 70000\n')
    with pytest.raises(BoardError, match="'port': expected an integer in 1..65535"):
        load_inventory(inv)
    inv.write_text('[boards.x]\nhost = "h"\nuser = "u"\nkey = "k"\n')
    with pytest.raises(BoardError, match="missing key 'root'"):
        load_inventory(inv)
    inv.write_text('[boards.x]\nhost = "h"\nuser = "u"\nkey = "k"\nroot = "/r"\npasword = "x"\n')
    with pytest.raises(BoardError, match="unknown key 'pasword'"):
        load_inventory(inv)


def test_quote_argv_and_local_transport(tmp_path: Path) -> None:
    assert quote_argv(["echo", "a b", "c;d"]) == "echo 'a b' 'c;d'"
    with pytest.raises(ValueError):
        quote_argv([])
    local = LocalTransport()
    assert local.run(["echo", "$(id)"]).stdout.strip() == "$(id)"
    (tmp_path / "f").write_bytes(b"0123456789")
    assert local.read_from(str(tmp_path / "f"), 4) == b"456789"


class TestSSHTransport(TransportContract):
    """The transport contract of tests/board/contract.py over a real sshd."""

    @pytest.fixture
    def conn(self, virtual_board: Board):
        link = connect(virtual_board)
        yield link
        link.close()

    @pytest.fixture
    def remote_dir(self, conn, virtual_board: Board) -> str:
        folder = posixpath.join(virtual_board.root, f"contract-{secrets.token_hex(4)}")
        conn.run(["mkdir", "-p", folder])
        yield folder
        conn.run(["rm", "-rf", folder])
