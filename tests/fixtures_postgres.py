"""Fixture of the stack on PostgreSQL: a real Prefect server on a private PostgreSQL cluster
(tasks.stack.postgres) with two process workers on odl-pool, for tests/e2e."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from pathlib import Path

import pytest


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def processes_under(folder: Path) -> list[str]:
    """Live processes whose command line names ``folder`` (a postmaster names its data folder)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(folder) in cmdline and state not in ("Z", "X"):
            found.append(f"{proc.name}: {cmdline}")
    return found


@pytest.fixture(scope="module")
def postgres_stack(tmp_path_factory: pytest.TempPathFactory):
    """``tasks.stack.server.up(env, workers=2)`` with ``db="postgres"`` in a fresh ODL_HOME on free ports; yields
    the stack's environment (``env["ODL_HOME"]``, ``env["ODL_PG_PORT"]``, ``env["PREFECT_API_URL"]``).
    At the end: ``down``, the cluster removed, and no process of it or of the stack left."""
    from tasks.stack import postgres, server

    home = tmp_path_factory.mktemp("pgstack") / "odl"
    port, pg_port = free_ports(2)
    env = server.stack_env(port=port, home=home, db="postgres", pg_port=pg_port)
    try:
        server.up(env, workers=2)
        yield env
    finally:
        server.down(home)
        left = {name: pid for name, pid in server.status(home).items() if pid}
        cluster = postgres.cluster_dir(home)
        left_pg = processes_under(cluster) if cluster else []
        postgres.remove(home)
        assert not left and not left_pg, f"still running after down: {left} {left_pg}"
