"""Fixture of simulated worker hosts (issue 45): a first home with its Prefect server on PostgreSQL
(listening beyond loopback, no worker of its own) and four virtual boards at 0.25 CPU in group
``fleet`` (bench/hosts.py's lab), and ``odl hosts`` run as a user runs it, for tests/e2e."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT


@pytest.fixture(scope="module")
def hosts_lab_module(tmp_path_factory: pytest.TempPathFactory):
    """The lab's stack environment; at the end hosts, boards, stack and cluster are gone."""
    from bench.hosts import fleet_lab

    if os.geteuid() != 0:
        pytest.skip("simulated hosts and virtual boards need root (ip netns, useradd, sshd)")
    with fleet_lab(tmp_path_factory.mktemp("hosts") / "odl", 4, 0.25) as env:
        yield env


@pytest.fixture
def hosts_lab(hosts_lab_module):
    """The module's lab for one test; its hosts are down after it (one that failed half-way leaves
    none running, with its environment, to the next)."""
    yield hosts_lab_module
    odl_hosts(hosts_lab_module, "down")


def odl_hosts(env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """``odl hosts ARGS`` for the lab's first home (``extra``: more environment variables)."""
    run_env = {**os.environ, "ODL_HOME": env["ODL_HOME"], "PYTHONPATH": str(PROJECT_ROOT), **extra}
    return subprocess.run([sys.executable, "-m", "flows.cli", "hosts", *args], env=run_env,
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip


def kill_host(netns: str) -> int:
    """SIGKILL every process in the network namespace ``netns`` (a host's worker and its flow runs);
    how many."""
    target = os.stat(f"/run/netns/{netns}").st_ino
    killed = 0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.stat(proc / "ns" / "net").st_ino == target:
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


def host_environ(pid: int) -> dict[str, str]:
    """The environment of process ``pid`` (a host's worker: its home, its store URL, its server)."""
    raw = Path(f"/proc/{pid}/environ").read_text().split("\0")
    return dict(kv.split("=", 1) for kv in raw if "=" in kv)
