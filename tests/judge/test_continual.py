"""Continual-learning figures of the nightly report: accuracy per learnt shard's held-out part,
forgetting and backward transfer as Avalanche defines them, from the registry's versions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tasks.judge.continual import continual_md, heldout_sets, learnt_shards, night_rows


@dataclass
class V:
    name: str
    metrics: dict[str, Any]
    promoted: bool = True
    info: dict[str, Any] = field(default_factory=dict)


def test_forgetting_and_bwt_follow_the_first_accuracy_of_each_shard():
    nights = [
        V("v0001", {"heldout": {"a": 0.90}}),
        V("v0002", {"heldout": {"a": 0.80, "b": 0.70}}),
        V("v0003", {"heldout": {"a": 0.85, "b": 0.60, "c": 0.95}}, promoted=False),
        V("v0004", {"accuracy": 0.9}),  # a night without held-out figures is skipped
    ]
    rows = night_rows(nights)
    assert [r["version"] for r in rows] == ["v0001", "v0002", "v0003"]
    assert [r["new"] for r in rows] == [["a"], ["b"], ["c"]]
    assert rows[0]["bwt"] is None and rows[0]["forgetting_mean"] is None
    assert rows[1]["forgetting"] == pytest.approx({"a": 0.10}) and rows[1]["bwt"] == pytest.approx(-0.10)
    # night 3: a lost 0.05 since night 1, b lost 0.10 since night 2: mean forgetting 0.075
    assert rows[2]["forgetting"] == pytest.approx({"a": 0.05, "b": 0.10})
    assert rows[2]["forgetting_mean"] == pytest.approx(0.075) and rows[2]["bwt"] == pytest.approx(-0.075)
    md = "\n".join(continual_md(rows))
    assert (
        "| night | promoted | new shards | BWT | forgetting |" in md
        and "| v0003 | no | c | -0.0750 | +0.0750 |" in md
    )
    assert "| night | a | b | c |" in md and "| v0003 | 0.850 (-0.050) 🔴 | 0.600 (-0.100) 🔴 | 0.950 |" in md


def test_bwt_matches_its_definition_on_random_matrices():
    rng = np.random.default_rng(0)
    for _ in range(20):
        t = int(rng.integers(2, 6))
        r = rng.uniform(size=(t, t))  # R[night][shard]; shard j first learnt on night j
        nights = [V(f"v{k:04d}", {"heldout": {f"s{j}": r[k, j] for j in range(k + 1)}}) for k in range(t)]
        last = night_rows(nights)[-1]
        expected = np.mean([r[t - 1, j] - r[j, j] for j in range(t - 1)])  # Lopez-Paz & Ranzato's BWT
        assert last["bwt"] == pytest.approx(expected)


def test_learnt_shards_and_their_heldout_files(tmp_path: Path):
    record = {"files": [{"name": "shard-0002.npz"}, {"name": "shard-0003.npz"}]}
    seen = {("shard-0001.npz", "abc"), ("shard-0002.npz", "def")}
    assert learnt_shards(record, seen) == ["shard-0001.npz", "shard-0002.npz", "shard-0003.npz"]
    (tmp_path / "shard-0001.npz").write_bytes(b"")
    (tmp_path / "shard-0003.npz").write_bytes(b"")
    found = heldout_sets(tmp_path, learnt_shards(record, seen))
    assert found == {"shard-0001": tmp_path / "shard-0001.npz", "shard-0003": tmp_path / "shard-0003.npz"}
    assert heldout_sets(None, ["shard-0001.npz"]) == {}
