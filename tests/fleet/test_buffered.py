"""The buffered mode's arithmetic (tasks/fleet/buffered.py) against FedBuff's formula written here on
its own, on random tensors: the staleness weight ``(1 + s) ** -a``, and FedAvg over the rebased
arrivals equal to ``g + sum_i n_i / N * w(s_i) * (trained_i - base_i)``; the recipe's refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tasks.board.inventory import Board
from tasks.errors import RecipeError
from tasks.fleet.board_round import check_fleet
from tasks.fleet.buffered import rebase, staleness_weight
from tasks.fleet.strategies import make_strategy
from tasks.recipe.extras import FleetSpec
from tests.prepare.kit import BASE, merge


@pytest.mark.parametrize("s", [0, 1, 2, 3, 7, 50])
@pytest.mark.parametrize("a", [0.0, 0.5, 1.0, 2.0])
def test_the_staleness_weight_is_the_formula(s, a):
    assert staleness_weight(s, a) == pytest.approx(1 / (1 + s) ** a, rel=1e-12)
    if a == 0.5:
        assert staleness_weight(s, a) == pytest.approx(1 / math.sqrt(1 + s), rel=1e-12)  # FedBuff's


def test_a_negative_staleness_is_a_bug():
    with pytest.raises(ValueError):
        staleness_weight(-1, 0.5)


def _tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "conv.w": rng.normal(size=(4, 3, 3)).astype(np.float32),
        "fc.b": rng.normal(size=7).astype(np.float32),
    }


@pytest.mark.parametrize("seed", range(20))
def test_fedavg_over_rebased_arrivals_is_fedbuffs_aggregate(seed):
    rng = np.random.default_rng(seed)
    versions = [_tensors(rng) for _ in range(4)]  # global versions 0..3; the current one is 3
    g = versions[-1]
    a = float(rng.choice([0.0, 0.5, 1.0]))
    arrivals = []
    for _ in range(int(rng.integers(1, 6))):
        base = int(rng.integers(0, 4))
        trained = {
            k: v + rng.normal(scale=0.1, size=v.shape).astype(np.float32) for k, v in versions[base].items()
        }
        arrivals.append((base, trained, int(rng.integers(1, 200))))
    total = sum(n for *_, n in arrivals)
    expected = {
        k: g[k].astype(np.float64)
        + sum(
            n / total * (1 + 3 - b) ** -a * (t[k].astype(np.float64) - versions[b][k]) for b, t, n in arrivals
        )
        for k in g
    }
    spec = FleetSpec(mode="buffered", staleness_exponent=a)
    rebased = [(rebase(g, versions[b], t, staleness_weight(3 - b, a)), n) for b, t, n in arrivals]
    got = make_strategy(spec).aggregate(g, rebased)
    for k in g:
        assert got[k].dtype == g[k].dtype
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-5, atol=1e-5)


def test_a_fresh_update_rebased_is_the_update_itself():
    rng = np.random.default_rng(0)
    g = _tensors(rng)
    w = _tensors(rng)
    assert all(np.allclose(rebase(g, g, w, 1.0)[k], w[k]) for k in g)


def _recipe(fleet: dict):
    from tasks.recipe.load import parse_recipe

    return parse_recipe(
        merge(BASE, {"data": {"train": None, "board_dataset": "datasets/digits"}, "fleet": fleet}),
        Path(__file__),
    )


def _boards(n: int) -> list[Board]:
    return [Board(name=f"b{i}", root="/tmp/x", transport="local") for i in range(n)]


def test_a_buffer_larger_than_the_group_is_refused_naming_the_field():
    recipe = _recipe({"mode": "buffered", "buffer_size": 4})
    with pytest.raises(RecipeError, match=r"fleet.buffer_size.*at most the group's 3 boards") as err:
        check_fleet(recipe, _boards(3))
    assert err.value.got == 4 and "\n" not in str(err.value)
    check_fleet(recipe, _boards(4))
    check_fleet(_recipe({"buffer_size": 4}), _boards(3))  # synchronous rounds: the buffer is not used


def test_krum_needs_a_buffer_large_enough_for_byzantine():
    recipe = _recipe({"mode": "buffered", "buffer_size": 3, "strategy": "krum", "byzantine": 1})
    with pytest.raises(RecipeError, match=r"fleet.byzantine.*a buffer of 3 arrivals \(fleet.buffer_size\)"):
        check_fleet(recipe, _boards(8))
    check_fleet(
        _recipe({"mode": "buffered", "buffer_size": 5, "strategy": "krum", "byzantine": 1}), _boards(8)
    )


def test_privacy_with_the_buffered_mode_is_refused_naming_the_field():
    privacy = {"target_epsilon": 10.0, "delta": 1e-5, "clip": 0.5, "noise_multiplier": 1.0}
    with pytest.raises(RecipeError, match=r"fleet.mode.*\"rounds\" with \[fleet.privacy\]") as err:
        _recipe({"mode": "buffered", "privacy": privacy})
    assert err.value.got == "buffered"


@pytest.mark.parametrize("bad", [{"buffer_size": 0}, {"staleness_exponent": -0.5}, {"mode": "async"}])
def test_bad_values_are_refused_naming_the_field(bad):
    with pytest.raises(RecipeError, match=f"fleet.{next(iter(bad))}"):
        _recipe({"mode": "buffered", **bad} if "mode" not in bad else bad)


def _run_of(tmp_path, names: list[str], k: int, strategy: str = "fedavg"):
    from types import SimpleNamespace

    from tasks.fleet.buffered import BufferedRun

    recipe = SimpleNamespace(name="r", fleet=FleetSpec(mode="buffered", buffer_size=k, strategy=strategy))
    weights = _tensors(np.random.default_rng(0))
    return BufferedRun(SimpleNamespace(recipe=recipe), None, "g", names, "run-1", tmp_path, weights)


def test_a_buffer_the_boards_still_training_cannot_fill_fails_the_run_naming_each_failure(tmp_path):
    import json

    from tasks.errors import DataError, FleetError, Straggler

    fleet = _run_of(tmp_path, ["a", "b", "c"], 2)
    assert [fleet.started(b) for b in ("a", "b", "c")] == [0, 0, 0]
    fleet.arrive("a", DataError("no datasets/digits"))
    fleet.check_progress()  # b and c may still fill it
    fleet.arrive("b", Straggler("board b: job j had not finished at the round's deadline"))
    with pytest.raises(FleetError, match=r"aggregation 1: the buffer holds 0 of 2 arrivals \(fleet.buffer_size\) "
                       r"and 1 boards are still training; a: DataError: no datasets.*; b: Straggler"):  # fmt: skip
        fleet.check_progress()
    rec = json.loads((tmp_path / "rounds.json").read_text())["rounds"][-1]
    assert rec["aggregate"] is None and rec["arrivals"] == []
    assert {b: row["status"] for b, row in rec["boards"].items()} == {
        "a": "failed",
        "b": "late",
        "c": "training",
    }


def _arrival(tmp_path, fleet, board: str, trained: dict[str, np.ndarray], samples: int):
    from tasks.fleet.rounds import BoardUpdate

    path = tmp_path / f"{board}-{len(fleet.rounds)}.npz"
    np.savez(path, **trained)
    up = BoardUpdate(board, "job", samples, path, {}, 0, path.stat().st_size, 1.0, 1.0, 1)
    fleet.arrive(board, up)


@pytest.mark.parametrize("strategy", ["fedavg", "median", "trimmed_mean"])
def test_a_strategy_combines_the_buffers_rebased_updates(tmp_path, monkeypatch, strategy):
    """Two aggregations of K = 3 over four boards; in the second, d (started from version 0)
    arrives one version stale: each aggregate is the strategy's formula, written here, over
    ``g + w(s) * (trained - base)``."""
    from tasks.fleet.buffered import BufferedRun

    monkeypatch.setattr(BufferedRun, "_host_metrics", lambda self, w, ckpt: {"accuracy": 0.5})
    rng = np.random.default_rng(7)
    fleet = _run_of(tmp_path, ["a", "b", "c", "d"], 3, strategy)
    g0 = fleet.weights
    for b in "abcd":
        fleet.started(b)
    moved = {
        b: {k: v + rng.normal(scale=0.1, size=v.shape).astype(np.float32) for k, v in g0.items()}
        for b in "abcd"
    }
    samples = {"a": 10, "b": 30, "c": 20, "d": 40}

    def combine(arrivals):  # (base weights, trained, samples, staleness)
        rows = [
            {k: g[k].astype(np.float64) + (1 + s) ** -0.5 * (t[k] - b[k]) for k in g}
            for b, t, _, s in arrivals
        ]
        if strategy == "fedavg":
            total = sum(n for *_, n, _ in arrivals)
            return {k: sum(n / total * r[k] for r, (*_, n, _) in zip(rows, arrivals, strict=True)) for k in g}
        # median of 3, and a trimmed mean that drops int(0.1 * 3) = 0 at each end: the plain mean
        stack = {k: np.stack([r[k] for r in rows]) for k in g}
        return {k: np.median(v, axis=0) if strategy == "median" else v.mean(axis=0) for k, v in stack.items()}

    g = g0
    for b in "abc":
        _arrival(tmp_path, fleet, b, moved[b], samples[b])
    assert fleet.full()
    want = combine([(g0, moved[b], samples[b], 0) for b in "abc"])
    rec = fleet.close_buffer()
    assert all(np.allclose(fleet.weights[k], want[k], atol=1e-6) for k in g0) and fleet.version == 1
    g1 = fleet.weights
    assert fleet.started("a") == fleet.started("c") == 1
    again = {k: v + rng.normal(scale=0.1, size=v.shape).astype(np.float32) for k, v in g1.items()}
    _arrival(tmp_path, fleet, "d", moved["d"], samples["d"])  # trained from version 0
    _arrival(tmp_path, fleet, "a", again, samples["a"])
    assert not fleet.full()
    fleet.started("b")
    _arrival(tmp_path, fleet, "b", again, samples["b"])
    g = g1
    want = combine(
        [(g0, moved["d"], samples["d"], 1), (g1, again, samples["a"], 0), (g1, again, samples["b"], 0)]
    )
    rec = fleet.close_buffer()
    assert all(np.allclose(fleet.weights[k], want[k], atol=1e-6) for k in g0)
    assert rec["arrivals"] == ["d", "a", "b"] and rec["boards"]["d"]["staleness"] == 1
    assert (
        rec["boards"]["d"]["weight"] == pytest.approx(2**-0.5) and rec["boards"]["c"]["status"] == "training"
    )
    assert sorted(fleet.bases) == [1]  # c still trains from version 1; version 0 is no board's base now
