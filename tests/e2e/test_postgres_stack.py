"""End to end: the stack on PostgreSQL (`odl stack up --db postgres --workers 2`): the server's tables
in database prefect of the private cluster, two workers on odl-pool, a tiny deployment run by them."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
PING_FILE = Path(__file__).with_name("pg_prefect.yaml")


def _api(env, path, body=None):
    req = urllib.request.Request(
        env["PREFECT_API_URL"] + path,
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _sql(env, sql: str) -> str:
    from flows import postgres

    return postgres.query(Path(env["ODL_HOME"]), int(env["ODL_PG_PORT"]), sql)


def test_server_is_healthy_and_its_database_is_postgres(postgres_stack):
    from flows.stack import api_healthy, stack_config, stack_env, status

    env = postgres_stack
    assert api_healthy(env)
    assert env["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://prefect:")
    assert _sql(env, "SELECT current_database() || ' ' || version()").startswith("prefect PostgreSQL ")
    tables = set(_sql(env, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").split())
    assert {"flow_run", "deployment", "work_pool", "worker", "alembic_version"} <= tables
    # the choice persists: a later stack_env for this ODL_HOME (status, deploy, the CLI) is on PostgreSQL
    assert stack_config(Path(env["ODL_HOME"]))["db"] == "postgres"
    later = stack_env(port=int(env["PREFECT_SERVER_API_PORT"]), home=Path(env["ODL_HOME"]))
    assert later["PREFECT_API_DATABASE_CONNECTION_URL"] == env["PREFECT_API_DATABASE_CONNECTION_URL"]
    running = status(Path(env["ODL_HOME"]))
    assert set(running) == {"worker", "worker-2", "prefect-server", "postgres"} and all(running.values())


def test_a_deployment_run_completes_and_is_stored_in_postgres(postgres_stack):
    from flows.stack import prefect_cli

    prefect_cli(postgres_stack, "deploy", "--all", "--prefect-file", str(PING_FILE))  # odl-pool: made by up
    out = prefect_cli(postgres_stack, "deployment", "run", "pg/ping", "--watch", "--watch-timeout", "90",
                      timeout=120)  # fmt: skip
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
    row = _sql(postgres_stack, f"SELECT state_type FROM flow_run WHERE id = '{run_id}'")
    assert row == "COMPLETED", out[-2000:]


def test_two_workers_are_online_on_the_pool(postgres_stack):
    from flows.stack import POOL, worker_name

    names, deadline = set(), time.monotonic() + 30
    expected = {worker_name("worker"), worker_name("worker-2")}
    while time.monotonic() < deadline:
        online = _api(postgres_stack, f"/work_pools/{POOL}/workers/filter")
        names = {w["name"] for w in online if w["status"] == "ONLINE"}
        if expected <= names:
            break
        time.sleep(1)
    assert expected <= names
    assert expected <= set(_sql(postgres_stack, "SELECT name FROM worker").split())
