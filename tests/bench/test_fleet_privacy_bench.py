"""Smoke test of bench/fleet_privacy.py in its --quick mode: a run without privacy and one with
central noise, each with its accuracy, and ε from the accountant for the private one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.test_bench import run_bench

pytestmark = pytest.mark.slow


def test_privacy_bench_states_accuracy_against_epsilon(tmp_path: Path) -> None:
    figures = run_bench("fleet_privacy", tmp_path)
    none, central = figures["rows"]
    assert (none["mode"], none["epsilon"], central["mode"]) == ("none", "inf", "central")
    assert float(central["epsilon"]) == pytest.approx(4.73, abs=0.01)  # z = 1, one round, δ 1e-5
    assert all(0 <= r["accuracy"] <= 1 and r["rounds_run"] == 1 for r in figures["rows"])
