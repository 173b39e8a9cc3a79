"""Fixtures of the shared store (tasks/store/): a private PostgreSQL cluster (tasks.stack.postgres, as
the stack's own) for the session, and a fresh database with its own role's password file per test.

The cluster listens on every address so that simulated hosts (tests/e2e/test_hosts.py: each in a
network namespace of its own) reach it at this machine's end of their veths; pg_hba.conf lets in
127.0.0.1 and their addresses (10.231.0.0/16) only, with the role's password."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.fixtures_postgres import free_ports, processes_under

_DATABASES = itertools.count(1)


@pytest.fixture(scope="session")
def store_cluster(tmp_path_factory: pytest.TempPathFactory):
    """(home, port) of a running private cluster; removed at the end, no process of it left."""
    from tasks.stack import postgres
    from tasks.vboard.sshd import SUBNET

    home = tmp_path_factory.mktemp("storepg") / "odl"
    (port,) = free_ports(1)
    try:
        postgres.start(home, port, listen="0.0.0.0")
        postgres.allow_network(home, f"{SUBNET}.0.0/16")
        yield home, port
    finally:
        cluster = postgres.cluster_dir(home)
        postgres.remove(home)
        left = processes_under(cluster) if cluster else []
        assert not left, f"still running after remove: {left}"


@pytest.fixture
def store_env(store_cluster) -> dict[str, str]:
    """ODL_STORE_URL and ODL_STORE_PASSWORD_FILE of a database of its own for this test (role ``odl``)."""
    from tasks.stack import postgres

    home, port = store_cluster
    database = f"store_{next(_DATABASES)}"
    pwfile = postgres.create_store_database(home, port, database=database, role="odl")
    return {
        "ODL_STORE_URL": f"postgresql://odl@127.0.0.1:{port}/{database}",
        "ODL_STORE_PASSWORD_FILE": str(pwfile),
    }


@pytest.fixture
def shared_store(store_env, monkeypatch):
    """This process configured for the test's store (the environment set); yields the env."""
    from tasks.store import configured_store

    for key, value in store_env.items():
        monkeypatch.setenv(key, value)
    yield store_env
    store = configured_store()
    if store is not None:
        store.close()


def store_password(env: dict[str, str]) -> str:
    """The password the test's store expects (to check that it appears nowhere)."""
    return Path(env["ODL_STORE_PASSWORD_FILE"]).read_text().strip()
