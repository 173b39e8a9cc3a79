"""Which board files a nightly job trains on: new since the model in service, plus replay."""

from __future__ import annotations

import pytest

from tasks.errors import DataError, NoNewData
from tasks.judge.registry import Decision, Registry
from tasks.nightly.board_data import pinned, seen_files, select


def _listing(*files: tuple[str, int]) -> dict:
    return {"path": "/b/datasets/d", "files": [
        {"name": n, "sha256": n.ljust(64, "0")[:64].replace(".", "a").replace("-", "b"), "size": 10, "samples": k}
        for n, k in files
    ]}  # fmt: skip


def _record(reg, tmp_path, files, promote, start="base"):
    model = tmp_path / "m.onnx"
    model.write_bytes(str(files).encode())
    decision = Decision(promote, "accuracy", 0.9, 0.1, "base", 0.8, 0.0, "t")
    info = {"board_data": {"files": files}, "start_from": {"from": start}}
    return reg.record("r", "b", model, {"accuracy": 0.9}, decision, info=info)


def test_new_files_plus_a_replayed_share_of_old_ones():
    listing = _listing(("s1", 100), ("s2", 100), ("s3", 100), ("s4", 60))
    seen = {(f["name"], f["sha256"]) for f in listing["files"][:3]}
    chosen, new, replayed = select(listing, "new+replay", 0.5, 0, seen)
    assert new == ["s4"] and len(replayed) == 1  # 60 new samples: >= 60 old ones make half the mix
    assert [f["name"] for f in chosen] == sorted(["s4", *replayed])  # listing order
    assert select(listing, "new+replay", 0.5, 0, seen) == (chosen, new, replayed)  # seeded
    _, _, none = select(listing, "new+replay", 0.0, 0, seen)
    assert none == []
    assert select(listing, "all", 0.0, 0, seen)[1] == ["s1", "s2", "s3", "s4"]
    with pytest.raises(NoNewData, match="no new file in /b/datasets/d since the last promoted run"):
        select(
            listing,
            "new+replay",
            0.5,
            0,
            seen | {(listing["files"][3]["name"], listing["files"][3]["sha256"])},
        )


def test_seen_follows_the_model_in_service_and_its_warm_start_ancestors(tmp_path):
    reg = Registry(tmp_path / "registry")
    f = _listing(("s1", 1), ("s2", 1), ("s3", 1))["files"]
    _record(reg, tmp_path, f[:1], True)  # v0001 from base on s1
    _record(reg, tmp_path, f[1:2], True, "v0001")  # v0002 warm from v0001 on s2
    _record(reg, tmp_path, f[2:], False, "v0002")  # v0003 rejected on s3
    assert {n for n, _ in seen_files(reg, "r", "b")} == {"s1", "s2"}  # s3: no model in service saw it
    reg.rollback("r", "b")
    assert {n for n, _ in seen_files(reg, "r", "b")} == {"s1"}  # s2 is new again after the rollback


def test_a_version_s_files_are_pinned_again_or_refused_when_changed(tmp_path):
    reg = Registry(tmp_path / "registry")
    listing = _listing(("s1", 1), ("s2", 1))
    _record(reg, tmp_path, listing["files"], True)
    assert pinned(reg, "r", "b", "v0001", listing) == listing["files"]
    listing["files"][1]["sha256"] = "f" * 64
    with pytest.raises(DataError, match="s2 is no longer on the board as trained"):
        pinned(reg, "r", "b", "v0001", listing)
