"""Smoke tests of the benchmarks: each runs in its --quick mode and writes sane figures.

They run the real scripts (a real virtual board, Prefect API, agent and torch loop) in a
subprocess, writing to a temporary file so bench/results/ keeps the last full figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT


def run_bench(name: str, tmp_path: Path) -> dict:
    """Run ``bench/<name>.py --quick --out tmp`` and return the JSON it wrote."""
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "bench" / f"{name}.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(out) in proc.stdout  # the table names where the figures went
    return json.loads(out.read_text())


def positive(row: dict, *keys: str) -> None:
    """Every key is a finite number > 0."""
    for key in keys:
        assert isinstance(row[key], int | float) and 0 < row[key] < float("inf"), (key, row[key])


def test_train_bench_compares_agent_and_torch(tmp_path: Path) -> None:
    figures = run_bench("train", tmp_path)
    (row,) = figures["rows"]
    assert row["recipe"] == "digits" and row["batch_size"] == 32 and row["steps"] == 100
    assert figures["pairs"] == row["pairs"] == 2
    positive(row, "agent_samples_per_s", "torch_samples_per_s", "agent_peak_rss_mb", "torch_peak_rss_mb")
    assert row["torch_threads"] == row["threads"] >= 1
    for ratio in (row["throughput_ratio"], row["rss_ratio"]):  # each pair's ratio: median and range
        positive(ratio, "median", "min", "max")
        assert ratio["min"] <= ratio["median"] <= ratio["max"] and ratio["n"] == 2
    assert row["rss_ratio"]["max"] < 1  # the agent never imports torch


def test_agent_bench_compares_agent_and_bare_loop(tmp_path: Path) -> None:
    (row,) = run_bench("agent", tmp_path)["rows"]
    assert row["recipe"] == "digits" and row["steps"] == 100 and not row["torch_loaded"]
    positive(row, "agent_samples_per_s", "bare_samples_per_s", "agent_peak_rss_mb")
    ratio = row["throughput_ratio"]  # the median of the pairs' ratios, with their range
    positive(ratio, "median", "min", "max")
    assert ratio["min"] <= ratio["median"] <= ratio["max"] and ratio["n"] == row["pairs"] == 2


def test_memory_bench_compares_estimate_and_agent(tmp_path: Path) -> None:
    figures = run_bench("memory", tmp_path)
    (row,) = figures["rows"]
    assert row["batch_size"] == 2 and row["agent_steps"] == 8
    positive(row, "estimate_mb", "probe_peak_mb", "agent_peak_mb", "ratio")
    assert row["ratio"] == pytest.approx(row["estimate_mb"] / row["agent_peak_mb"], rel=0.01)
    assert row["within"] == (abs(row["ratio"] - 1) <= figures["tolerance"])


@pytest.mark.slow
@pytest.mark.board
def test_e2e_bench_times_stages_and_skips_cached_work(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the virtual board needs root (useradd, ip netns, sshd)")
    figures = run_bench("e2e", tmp_path)
    cold, again = figures["runs"]
    assert (cold["run"], again["run"]) == ("cold", "unchanged")
    for row in (cold, again):
        positive(row, "total_s", "train_loop_s", "overhead_s", "train", "deploy", "evaluate")
        assert row["steps"] == 26  # 2 epochs of 400 digits at batch 32 (13 steps each)
        assert row["overhead_share"] == pytest.approx(row["overhead_s"] / row["total_s"], abs=0.002)
    assert cold["bytes_uploaded"] > 0 and cold["blobs_uploaded"] >= 5
    assert again["bytes_uploaded"] == 0 and again["blobs_uploaded"] == 0 and again["blobs_skipped"] >= 5
    assert again["export"] < cold["export"]  # cached: the result is read back, nothing is exported
    positive(figures["prefect_noop"], "empty_flow_s", "flow_with_tasks_s")


def test_zoo_bench_prepares_real_classifiers(tmp_path: Path) -> None:
    """Three torchvision models that needed a fix-up, a strategy or export without deep copy
    (MobileNetV3, SqueezeNet, MNASNet) pass end to end, each in its own child. The other fix-ups are
    tests/prepare's (DenseNet's shared Concats, GoogLeNet's auxiliary heads); the whole zoo is the
    bench's, run by hand."""
    figures = run_bench("zoo", tmp_path)
    rows = {r["model"]: r for r in figures["rows"]}
    assert set(rows) == {"mobilenet_v3_small", "squeezenet1_1", "mnasnet0_5"}
    assert figures["pass_or_specific_ratio"] == 1.0
    assert all(r["result"] == "pass" for r in rows.values()), {m: r["result"] for m, r in rows.items()}
    for r in rows.values():
        positive(r, "trainable", "board_peak_mb", "seconds")


@pytest.mark.slow
def test_foreign_onnx_bench_prepares_files_of_other_exporters(tmp_path: Path) -> None:
    """torchvision's mobilenet_v3_small exported at opset 13 (BN not folded), 17 folded, by onnxslim
    and by the dynamo exporter with a fixed batch: three prepare with the prefix cache on and the join
    rehearsed, the fixed batch stops with one line that says how to export it."""
    figures = run_bench("foreign_onnx", tmp_path)
    rows = {r["export"]: r for r in figures["rows"]}
    for how in ("ts13", "ts17-folded", "onnxslim17"):
        assert (
            rows[how]["result"] == "pass"
            and rows[how]["prefix_cache"] == "on"
            and rows[how]["join"] == "rehearsed"
        )
    assert rows["dynamo18"]["result"] == "specific" and "dynamic batch axis" in rows["dynamo18"]["message"]


@pytest.mark.slow
def test_timm_bench_prepares_a_seeded_sample_of_families(tmp_path: Path) -> None:
    """Two timm families drawn with a fixed seed from bench/timm_families.json (this seed draws two
    that prepare in seconds, efficientvit_b0 and edgenext_xx_small): each passes or stops with one
    specific line (never ORT's text, a crash or an empty reason)."""
    out = tmp_path / "zoo_timm.json"
    cmd = [
        sys.executable,
        str(PROJECT_ROOT / "bench" / "zoo_timm.py"),
        "--quick",
        "2",
        "--seed",
        "20262612",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["families"] == 2 and figures["raw"] == 0, [r.get("message") for r in figures["rows"]]


def test_teacher_bench_measures_labelling_beside_training(tmp_path: Path) -> None:
    figures = run_bench("teacher", tmp_path)
    taught, plain = figures["rows"]
    assert taught["samples"] == plain["samples"] == 500 and plain["teacher_s"] == 0
    positive(taught, "teacher_s", "label_per_s", "train_s", "teacher_peak_mb", "peak_rss_mb", "estimate_mb")
    positive(plain, "train_s", "peak_rss_mb")
    assert taught["peak_rss_mb"] <= taught["estimate_mb"]  # the job stays inside validation's estimate
    ratio = figures["ratios"]["peak_with_teacher_over_without"]
    assert ratio == pytest.approx(taught["peak_rss_mb"] / plain["peak_rss_mb"], rel=0.01)


def test_runtimes_bench_compares_ort_and_autograd(tmp_path: Path) -> None:
    figures = run_bench("runtimes", tmp_path)
    (row,) = figures["rows"]
    assert row["recipe"] == "digits" and row["steps"] == 50 and figures["pairs"] == row["pairs"] == 1
    assert row["dropout"] == "none" and row["repeatable"]
    assert row["loss_rel"] < 1e-4 and row["weight_abs"] < 1e-4  # the runtimes' equivalence bounds
    assert row["grad_vs_torch"] < 1e-5 and row["grad_worst_tensor"]  # the step's gradients are PyTorch's
    assert 0 <= row["ulp_weight_abs"] < 1e-4  # the same job from weights 1 ulp away: rounding's own reach
    for name in ("ort", "autograd"):
        for figure in (row[f"{name}_samples_per_s"], row[f"{name}_peak_rss_mb"]):
            positive(figure, "median", "min", "max")
            assert figure["n"] == 1


def test_fleet_scale_bench_closes_a_faulty_round_on_its_quorum_and_deadline(tmp_path: Path) -> None:
    """20 real pull-mode agents, 8 at once: one vanishes once it took its job (5 %), one sends a
    scaled update (x -10) and one NaN tensors (1 % each, rounded up). The round closes at its
    deadline on its quorum (18), names the two it left out and why, flags the poisoned one, and the
    trimmed mean's aggregate stays within the honest boards' range, coordinate by coordinate."""
    if os.geteuid() != 0:
        pytest.skip("fleet_scale counts bytes with nftables (root)")
    (row,) = run_bench("fleet_scale", tmp_path)["rows"]
    faults = row["faults"]
    (vanished,), (poisoned,), (malformed,) = faults["vanish"], faults["poison"], faults["malformed"]
    assert row["boards"] == 20 and row["took_part"] == 18 and row["min_boards"] == 18
    assert sorted(row["left_out"]) == sorted([vanished, malformed]), row["left_out"]
    assert row["left_out"][vanished].startswith("late: Straggler") and "deadline" in row["left_out"][vanished]
    assert row["left_out"][malformed].startswith("rejected: ") and "NaN" in row["left_out"][malformed]
    assert poisoned in row["outliers"] and row["identical"]  # within the honest range
    assert row["wall_s"] >= 40 and row["services_at_once"] <= 8
    positive(row, "host_cpu", "flow_cpu", "server_cpu", "endpoint_cpu", "requests", "endpoint_requests")
    assert {"poll", "blobs", "result"} <= set(row["endpoint_routes"])
