"""The transport contract on the local transport (no root, no sshd); tests/e2e runs it over SSH."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.board.inventory import Board
from tasks.board.transport import LocalTransport, connect
from tests.board.contract import TransportContract


class TestLocalTransport(TransportContract):
    @pytest.fixture
    def conn(self, tmp_path: Path):
        link = connect(Board(name="here", transport="local", root=str(tmp_path / "root")))
        assert isinstance(link, LocalTransport)
        yield link
        link.close()

    @pytest.fixture
    def remote_dir(self, tmp_path: Path) -> str:
        folder = tmp_path / "board-side"
        folder.mkdir()
        return str(folder)


def test_a_transport_is_a_context_manager_that_closes_on_exit(tmp_path: Path, monkeypatch) -> None:
    link = connect(Board(name="here", transport="local", root=str(tmp_path / "root")))
    closed: list[str] = []
    monkeypatch.setattr(link, "close", lambda: closed.append("closed"))
    with link as same:
        assert same is link
        assert closed == []
    assert closed == ["closed"]
    with pytest.raises(RuntimeError), link:
        raise RuntimeError("the block failed")
    assert closed == ["closed", "closed"]
