"""The fan-out of a fleet round (tasks.fleet.fanout): board groups, the weights a group run gets and
the updates it sends back, exact to the byte (the aggregation on the first host is then the one-host
code on the same bytes: tests/e2e/test_hosts.py checks that end to end)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tasks.errors import FleetError, Straggler
from tasks.fleet import fanout
from tasks.fleet.board_round import BoardUpdate


def test_groups_are_contiguous_even_and_never_empty():
    names = [f"b{i}" for i in range(7)]
    assert fanout.split(names, 3) == [["b0", "b1", "b2"], ["b3", "b4"], ["b5", "b6"]]
    assert fanout.split(names, 10) == [[n] for n in names]  # more groups than boards: one board each
    assert sum(fanout.split(names, 2), []) == names
    with pytest.raises(FleetError, match="fanout 0"):
        fanout.split(names, 0)


def test_weights_travel_exactly():
    rng = np.random.default_rng(0)
    weights = {"fc.weight": rng.standard_normal((10, 32)).astype(np.float32), "fc.bias": np.arange(10.0)}
    back = fanout.unpack_weights(fanout.pack_weights(weights))
    assert sorted(back) == sorted(weights)
    for name, w in weights.items():
        assert back[name].dtype == w.dtype and back[name].tobytes() == w.tobytes()


def test_an_update_comes_back_byte_for_byte(tmp_path: Path):
    npz = tmp_path / "on-host" / "trainable.npz"
    npz.parent.mkdir()
    np.savez(npz, w=np.linspace(0, 1, 50, dtype=np.float32))
    sent = BoardUpdate("b1", "job-1", 40, npz, {"train_loss": 0.5}, 1000, npz.stat().st_size, 2.5, 1.5, 1)
    item = fanout.entry("b1", sent, "h2")
    got = fanout.received(item, tmp_path / "first" / "b1")
    assert isinstance(got, BoardUpdate)
    assert got.update.read_bytes() == npz.read_bytes() and got.update != npz
    assert {**vars(got), "update": None} == {**vars(sent), "update": None}
    assert fanout.payload_bytes([item]) == len(item["npz"]) > npz.stat().st_size  # base64


def test_a_board_without_update_stays_late_or_failed(tmp_path: Path):
    late = fanout.received(fanout.entry("b1", Straggler("cut at the deadline"), "h1"), tmp_path)
    failed = fanout.received(fanout.entry("b2", FleetError("board down"), "h1"), tmp_path)
    silent = fanout.received(fanout.entry("b3", None, "h1"), tmp_path)
    assert isinstance(late, Straggler) and "cut at the deadline" in str(late) and "h1" in str(late)
    assert type(failed) is FleetError and "board down" in str(failed)
    assert type(silent) is FleetError and "wait ended first" in str(silent)
    assert list(fanout.group_failed(["b1", "b2"], "crashed")) == ["b1", "b2"]


def test_with_a_shared_store_weights_and_updates_travel_by_hash(shared_store, tmp_path: Path):
    """Nothing model-sized in a group run's parameters or result record: the weights and each update
    are blobs of the store, named by their sha256, and come back byte for byte (verified)."""
    rng = np.random.default_rng(1)
    weights = {"fc.weight": rng.standard_normal((64, 64)).astype(np.float32)}
    text = fanout.pack_weights(weights, tmp_path / "first")
    assert text.startswith("sha256:") and len(text) == 71  # 16 KB of weights, a 71-character name
    back = fanout.unpack_weights(text, tmp_path / "group")
    assert back["fc.weight"].tobytes() == weights["fc.weight"].tobytes()
    npz = tmp_path / "on-host" / "trainable.npz"
    npz.parent.mkdir()
    np.savez(npz, w=np.linspace(0, 1, 5000, dtype=np.float32))
    sent = BoardUpdate("b1", "job-1", 40, npz, {"train_loss": 0.5}, 1000, npz.stat().st_size, 2.5, 1.5, 1)
    item = fanout.entry("b1", sent, "h2")
    assert item["npz"].startswith("sha256:") and fanout.payload_bytes([item]) == 71
    got = fanout.received(item, tmp_path / "first" / "b1")
    assert got.update.read_bytes() == npz.read_bytes()
