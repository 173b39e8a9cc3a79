"""The inventory and the pinned host keys read through the shared store: a board added on one host
is in the other's inventory, its pinned key in that host's known_hosts; edits from two hosts both
land; without a store nothing leaves the local file."""

from __future__ import annotations

import threading

import pytest

from tasks.board.inventory import Board, get_board, load_inventory, remove_board, save_board, save_group
from tasks.store import Documents, configured_store

pytestmark = pytest.mark.slow
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheTestOnly0000000000000000000"


def _home(monkeypatch, tmp_path, name: str):
    monkeypatch.setenv("ODL_HOME", str(tmp_path / name))
    monkeypatch.delenv("ODL_INVENTORY", raising=False)
    return tmp_path / name


def _board(name: str, known_hosts, port: int = 2222) -> Board:
    return Board(name=name, host="10.0.0.7", port=port, user="odl", key=known_hosts.with_name("id"),
                 known_hosts=known_hosts, root="/home/odl/odl")  # fmt: skip


def test_a_board_added_on_one_host_is_known_with_its_pinned_key_on_another(
    shared_store, tmp_path, monkeypatch
):
    kh_a = tmp_path / "a-keys" / "known_hosts"
    kh_a.parent.mkdir()
    kh_a.write_text(f"[10.0.0.7]:2222 {KEY}\nother-host {KEY}\n")
    _home(monkeypatch, tmp_path, "a")
    save_board(_board("mp2-a", kh_a))
    shared = Documents(configured_store()).get("known_hosts/mp2-a").content
    assert shared == f"[10.0.0.7]:2222 {KEY}\n".encode()  # only the board's own line

    home_b = _home(monkeypatch, tmp_path, "b")
    assert not (home_b / "inventory.toml").exists()
    kh_a.write_text("unrelated 1.2.3.4\n")  # B's copy of that file lacks the pin (as on another host)
    board = get_board("mp2-a")
    assert (
        board.host == "10.0.0.7"
        and (home_b / "inventory.toml").read_text() == (tmp_path / "a" / "inventory.toml").read_text()
    )
    assert kh_a.read_text() == f"unrelated 1.2.3.4\n[10.0.0.7]:2222 {KEY}\n"

    save_group("lab", ["mp2-a"])  # edited on B, seen on A
    _home(monkeypatch, tmp_path, "a")
    assert "[groups]" not in (tmp_path / "a" / "inventory.toml").read_text()  # read-through: on the next read
    assert load_inventory() and "[groups]" in (tmp_path / "a" / "inventory.toml").read_text()
    assert remove_board("mp2-a") and load_inventory() == {}
    _home(monkeypatch, tmp_path, "b")
    assert load_inventory() == {}


def test_two_hosts_adding_boards_at_once_both_land(shared_store, tmp_path, monkeypatch):
    _home(monkeypatch, tmp_path, "seed")
    kh = tmp_path / "known_hosts"
    errors: list[BaseException] = []

    def add(names: list[str]) -> None:
        try:
            for name in names:
                save_board(_board(name, kh))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=([f"{t}{i}" for i in range(10)],)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _home(monkeypatch, tmp_path, "reader")
    assert sorted(load_inventory()) == sorted(f"{t}{i}" for t in "ab" for i in range(10))


def test_without_a_store_the_inventory_stays_local(tmp_path, monkeypatch):
    monkeypatch.delenv("ODL_STORE_URL", raising=False)
    home = _home(monkeypatch, tmp_path, "solo")
    save_board(_board("solo", tmp_path / "kh"))
    assert list(load_inventory()) == ["solo"] and (home / "inventory.toml").is_file()
    assert configured_store() is None
