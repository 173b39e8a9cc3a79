"""Smoke test of bench/hosts.py in its --quick mode: two simulated hosts, two boards, one round
fanned out over both (no warm-up round: each host prepares in it); every figure measured (not
assumed) and both hosts used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.bench.test_bench import positive, run_bench

pytestmark = [pytest.mark.slow, pytest.mark.board]


def test_hosts_bench_measures_a_round_fanned_out_over_two_hosts(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("simulated hosts and virtual boards need root (ip netns, useradd, sshd)")
    figures = run_bench("hosts", tmp_path)
    (row,) = figures["rows"]
    assert (row["hosts"], row["boards"], row["boards_ok"], row["hosts_used"]) == (2, 2, 2, 2)
    assert figures["rounds"] == 1 and not row["warm_up"]
    positive(row, "round_s", "hosts_cpu_per_board_s", "first_host_cpu_per_board_s", "link_bytes_per_round",
             "server_payload_bytes_per_round", "board_bytes_per_round")  # fmt: skip
    # what crosses the hosts' links includes every board's update and the weights each group got
    assert row["link_bytes_per_round"] > row["board_bytes_per_round"]
    assert 0 < row["accuracy"] <= 1
