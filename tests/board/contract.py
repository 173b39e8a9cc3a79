"""One contract for every transport (as Flower tests its LinkState implementations): the board code
may rely on exactly these behaviours, whichever transport an inventory entry names.

A test module subclasses :class:`TransportContract` and provides two fixtures: ``conn`` (an open
transport) and ``remote_dir`` (an empty folder on the board side, as a string path)."""

from __future__ import annotations

import posixpath
import secrets
from pathlib import Path

import pytest

from tasks.errors import DeviceUnreachable, RemoteCommandFailed, TransferError


class TransportContract:
    """Behaviour shared by SSHTransport and LocalTransport."""

    def test_run_passes_each_argument_literally(self, conn, remote_dir: str) -> None:
        marker = posixpath.join(remote_dir, f"pwned-{secrets.token_hex(4)}")
        evil = [f"x; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", "a'b\"c", "*", ""]
        assert conn.run(["printf", "%s\\n", *evil]).stdout.splitlines() == evil
        assert not conn.exists(marker)

    def test_exit_codes_and_failures(self, conn) -> None:
        failed = conn.run(["sh", "-c", "echo oops >&2; exit 7"], check=False)
        assert (failed.code, failed.stderr.strip(), bool(failed)) == (7, "oops", False)
        assert bool(conn.run(["true"])) and conn.run(["cat"], input=b"fed").stdout == "fed"
        with pytest.raises(RemoteCommandFailed) as info:
            conn.run(["false"])
        assert info.value.code == 1 and info.value.command == ["false"]

    def test_a_command_past_its_timeout_is_a_retryable_link_error(self, conn) -> None:
        with pytest.raises(DeviceUnreachable) as info:
            conn.run(["sleep", "5"], timeout=0.5)
        assert info.value.retryable

    def test_put_get_round_trip_with_progress(self, conn, remote_dir: str, tmp_path: Path) -> None:
        data = secrets.token_bytes(3 * 2**20 + 17)
        (tmp_path / "up.bin").write_bytes(data)
        remote = posixpath.join(remote_dir, "blob.bin")
        sent: list[tuple[int, int]] = []
        conn.put(tmp_path / "up.bin", remote, lambda done, total: sent.append((done, total)))
        assert sent[-1] == (len(data), len(data)) and conn.exists(remote)
        got: list[int] = []
        conn.get(remote, tmp_path / "down.bin", lambda done, _total: got.append(done))
        assert (tmp_path / "down.bin").read_bytes() == data and got[-1] == len(data)

    def test_transfer_failures_leave_no_partial_file(self, conn, remote_dir: str, tmp_path: Path) -> None:
        with pytest.raises(TransferError):
            conn.get(posixpath.join(remote_dir, "absent"), tmp_path / "absent")
        assert not (tmp_path / "absent").exists()
        (tmp_path / "f").write_bytes(b"x")
        with pytest.raises(TransferError):
            conn.put(tmp_path / "f", posixpath.join(remote_dir, "no-such-dir", "f"))

    def test_read_from_an_offset_and_exists(self, conn, remote_dir: str) -> None:
        path = posixpath.join(remote_dir, "events.jsonl")
        assert conn.read_from(path, 0) == b"" and not conn.exists(path)
        conn.run(["sh", "-c", 'printf "one\\ntwo\\n" > "$1"', "sh", path])
        assert conn.exists(path) and conn.read_from(path, 4) == b"two\n"
        assert conn.read_from(path, 8) == b""
