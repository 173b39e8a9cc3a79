"""``odl data push`` appends like a board application: atomic, never rewriting a file."""

from __future__ import annotations

import pytest

from tasks.errors import HostExit


@pytest.fixture
def board_root(local_board_home, monkeypatch):
    from tasks.board.inventory import load_inventory

    monkeypatch.setenv("ODL_HOME", str(local_board_home))
    return load_inventory(local_board_home / "inventory.toml")["here"].root


def test_push_appends_once_and_refuses_to_rewrite(board_root, tmp_path, capsys):
    import os
    from pathlib import Path

    from flows.cli import main

    shard = tmp_path / "shard-0001.npz"
    shard.write_bytes(b"first shard")
    folder = Path(board_root) / "datasets" / "push-test"
    assert main(["data", "push", "here", str(shard), "--to", "datasets/push-test"]) == 0
    assert (folder / "shard-0001.npz").read_bytes() == b"first shard"
    assert not [n for n in os.listdir(folder) if n.startswith(".")]  # no temporary left
    assert main(["data", "push", "here", str(shard), "--to", "datasets/push-test"]) == 0
    assert "already there (same sha256)" in capsys.readouterr().out
    shard.write_bytes(b"other content")
    assert main(["data", "push", "here", str(shard), "--to", "datasets/push-test"]) == HostExit.DATA
    assert "exists with other content" in capsys.readouterr().err
    assert (folder / "shard-0001.npz").read_bytes() == b"first shard"
    assert main(["data", "push", "here", str(shard), "--to", "../outside"]) == HostExit.DATA
