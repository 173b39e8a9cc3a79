"""Smoke test of bench/detector.py: its --quick mode (ssdlite_small at 96 px, batch 4) compares the
agent, a bare ORT loop and a PyTorch loop, and validation's RAM estimate with the agent's peak."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.test_bench import positive, run_bench


def test_detector_bench_compares_agent_bare_ort_torch_and_estimate(tmp_path: Path) -> None:
    figures = run_bench("detector", tmp_path)
    (row,) = figures["rows"]
    assert row["recipe"] == "ssdlite-small" and row["batch_size"] == 4
    assert row["agent_steps"] == row["warmup_steps"] + row["steps"] and row["steps"] > 0
    positive(row, "agent_samples_per_s", "bare_samples_per_s", "torch_samples_per_s")
    positive(row, "agent_peak_rss_mb", "bare_peak_rss_mb", "torch_peak_rss_mb", "estimate_mb")
    assert row["agent_vs_bare"] == pytest.approx(
        row["agent_samples_per_s"] / row["bare_samples_per_s"], rel=0.01
    )
    assert row["agent_vs_torch"] == pytest.approx(
        row["agent_samples_per_s"] / row["torch_samples_per_s"], rel=0.01
    )
    assert row["estimate_ratio"] == pytest.approx(row["estimate_mb"] / row["agent_peak_rss_mb"], rel=0.01)
    assert row["within_target"] == (abs(row["estimate_ratio"] - 1) <= figures["tolerance"])
    assert row["torch_threads"] == row["threads"] >= 1 and row["batchnorm"] == "frozen"
    assert not row["bare_torch_loaded"]
    assert row["agent_peak_rss_mb"] < row["torch_peak_rss_mb"]  # the agent never imports torch
    # same weights, trainable set, batches and learning rates: the same first-step loss everywhere
    first = row["first_loss"]
    assert first["agent"] == pytest.approx(first["bare"], rel=1e-5)
    assert first["agent"] == pytest.approx(first["torch"], rel=1e-4)
