"""A board's pinned host keys come from a known_hosts file parsed once per change, whatever the
number of boards it pins (paramiko's loader is quadratic in its lines)."""

from __future__ import annotations

import os

import paramiko

from tasks.board.transport.host_keys import pinned_keys


def _line(host: str, key: paramiko.PKey) -> str:
    return f"{host} {key.get_name()} {key.get_base64()}\n"


def test_each_board_gets_its_own_key_and_a_changed_file_is_read_again(tmp_path):
    keys = [paramiko.Ed25519Key.from_private_key_file(str(_keyfile(tmp_path, i))) for i in range(3)]
    path = tmp_path / "known_hosts"
    path.write_text("".join(_line(f"[10.0.0.{i}]:22{i}", k) for i, k in enumerate(keys[:2])))
    assert [(t, k.get_base64()) for t, k in pinned_keys(path, "10.0.0.1", 221)] == [
        ("ssh-ed25519", keys[1].get_base64())
    ]
    assert pinned_keys(path, "10.0.0.2", 222) == []  # not pinned: the connection will refuse it
    with path.open("a") as out:  # a board added (odl board up pins its key)
        out.write(_line("10.0.0.2", keys[2]))
    os.utime(path, ns=(1, 1))  # another mtime even within the clock's resolution
    assert [k.get_base64() for _, k in pinned_keys(path, "10.0.0.2", 22)] == [keys[2].get_base64()]


def _keyfile(folder, i: int):
    import subprocess

    path = folder / f"key{i}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path
