"""``odl hosts``: bad input refused in one line naming the flag, before anything starts; a host's
environment carries the store's address and a copy of its password file, never the database URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT


def _odl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ODL_HOME": str(home), "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run([sys.executable, "-m", "flows.cli", "hosts", *args], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--hosts", "0"], "--hosts 0"),
        (["--cpu-quota", "0"], "--cpu-quota 0"),
        (["--limit", "0"], "--limit 0"),
    ],
)
def test_bad_counts_are_refused_in_one_line(tmp_path: Path, args: list[str], flag: str):
    done = _odl(tmp_path / "odl", "up", *args)
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"odl: error: {flag}:")
    assert not (tmp_path / "odl" / "hosts").exists()  # nothing started, nothing recorded


def test_up_without_a_postgres_server_names_the_command_to_run(tmp_path: Path):
    done = _odl(tmp_path / "odl", "up", "--hosts", "1")
    assert done.returncode != 0 and done.stderr.count("\n") == 1
    assert "odl stack up --db postgres" in done.stderr


def test_down_and_status_with_no_host_say_so(tmp_path: Path):
    assert _odl(tmp_path / "odl", "status").stdout.strip() == "no host is up (odl hosts up --hosts N)"
    assert _odl(tmp_path / "odl", "down").stdout.strip() == "stopped: no host was up"


def test_a_host_gets_the_store_variables_and_no_database_url(tmp_path: Path, monkeypatch):
    from tasks.hosts.lifecycle import host_env

    secret = tmp_path / "store.pw"
    secret.write_text("s3cret-value\n")
    monkeypatch.setenv("ODL_STORE_URL", "postgresql://odl@10.0.0.5:5432/odl")
    monkeypatch.setenv("ODL_STORE_PASSWORD_FILE", str(secret))
    base = {"ODL_HOME": "/first", "ODL_INVENTORY": "/first/inv.toml", "ODL_STORE_URL": "stale",
            "PREFECT_API_DATABASE_CONNECTION_URL": "postgresql+asyncpg://prefect:pw@127.0.0.1/prefect"}  # fmt: skip
    home = tmp_path / "h1"
    home.mkdir()
    env = host_env(base, home, "http://10.231.7.1:4200/api")
    assert env["ODL_HOME"] == str(home) and env["PREFECT_API_URL"] == "http://10.231.7.1:4200/api"
    assert "PREFECT_API_DATABASE_CONNECTION_URL" not in env and "ODL_INVENTORY" not in env
    assert env["ODL_STORE_URL"] == "postgresql://odl@10.0.0.5:5432/odl"
    copy = Path(env["ODL_STORE_PASSWORD_FILE"])
    assert copy.parent == home and copy.read_text() == "s3cret-value\n"
    assert copy.stat().st_mode & 0o777 == 0o600
    assert not any("s3cret" in v for v in env.values())  # the password itself is in no variable


@pytest.mark.parametrize(
    ("url", "seen"),
    [
        ("postgresql://odl@127.0.0.1:5433/odl_store", "postgresql://odl@10.231.7.1:5433/odl_store"),
        ("postgresql://odl@localhost/odl_store", "postgresql://odl@10.231.7.1/odl_store"),
        ("postgresql://odl@[::1]:5433/odl_store", "postgresql://odl@10.231.7.1:5433/odl_store"),
        ("postgresql://odl@10.0.0.5:5433/odl_store", "postgresql://odl@10.0.0.5:5433/odl_store"),
    ],
)
def test_a_store_on_this_machine_is_reached_at_the_veths_end(
    url: str, seen: str, tmp_path: Path, monkeypatch
):
    """A host in a namespace reaches this machine's loopback store at this machine's end of its
    veth (as it reaches the server); another address, or a host without a namespace, as given."""
    from tasks.hosts.lifecycle import host_env, store_url_for

    monkeypatch.setenv("ODL_STORE_URL", url)
    monkeypatch.delenv("ODL_STORE_PASSWORD_FILE", raising=False)
    assert host_env({}, tmp_path, "http://10.231.7.1:4200/api", "10.231.7.1")["ODL_STORE_URL"] == seen
    assert store_url_for(url, None) == url


def test_a_host_started_with_other_odl_variables_is_not_kept(monkeypatch):
    from tasks.hosts.lifecycle import passed_on

    monkeypatch.delenv("ODL_STORE_URL", raising=False)
    before = passed_on()
    monkeypatch.setenv("ODL_STORE_URL", "postgresql://odl@127.0.0.1:5433/odl_store")
    with_store = passed_on()
    assert with_store != before
    monkeypatch.setenv("ODL_HOME", "/elsewhere")  # each host has its own: not compared
    assert passed_on() == with_store
