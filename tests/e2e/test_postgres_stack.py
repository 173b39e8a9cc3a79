"""End to end: the stack on PostgreSQL (`odl stack up --db postgres --workers 2`): the server's tables
in database prefect of the private cluster, two workers on odl-pool, a tiny deployment run by them,
and `prefect deployment run odl/fleet` over two virtual boards, one of which loses its link in the
middle of round 1 (cut at the deadline, the quorum holds) and is back for round 2."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.e2e.prefect_api import post as _api

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
PING_FILE = Path(__file__).with_name("pg_prefect.yaml")


def _sql(env, sql: str) -> str:
    from tasks.stack import postgres

    return postgres.query(Path(env["ODL_HOME"]), int(env["ODL_PG_PORT"]), sql)


def test_server_is_healthy_and_its_database_is_postgres(postgres_stack):
    from tasks.stack.server import api_healthy, stack_config, stack_env, status

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
    from tasks.stack.server import prefect_cli

    prefect_cli(postgres_stack, "deploy", "--all", "--prefect-file", str(PING_FILE))  # odl-pool: made by up
    out = prefect_cli(postgres_stack, "deployment", "run", "pg/ping", "--watch", "--watch-timeout", "90",
                      timeout=120)  # fmt: skip
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
    row = _sql(postgres_stack, f"SELECT state_type FROM flow_run WHERE id = '{run_id}'")
    assert row == "COMPLETED", out[-2000:]
    # the stack streams a run's logs out: the watch shows the flow's own log line (odl/full's last
    # is its verdict and report link), not only Prefect's events and the final state's name
    assert "pong" in out, out[-2000:]


def test_two_workers_are_online_on_the_pool(postgres_stack):
    from tasks.stack.server import POOL, worker_name

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


def _started(board) -> bool:  # noqa: ANN001
    """Whether a job on the virtual board has written its "started" event (read as root, locally)."""
    return any('"started"' in p.read_text() for p in Path(board.root, "jobs").glob("*/events.jsonl"))


def _wait(what: str, check, timeout: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.mark.board
def test_fleet_deployment_runs_two_rounds_and_survives_a_board_down_mid_round(postgres_stack):
    """Two boards, two FedAvg rounds, quorum 1: board B's link goes down after its round-1 job
    started; round 1 closes with A alone when the deadline cuts B, and B takes part in round 2."""
    import os

    from tasks import stages
    from tasks.board.inventory import save_group
    from tasks.board.transport import connect
    from tasks.paths import PROJECT_ROOT
    from tasks.recipe.load import load_recipe
    from tasks.stack.server import prefect_cli
    from tasks.vboard.faults import set_link
    from tasks.vboard.lifecycle import board_down, board_up
    from tests.fixtures_board import BOARD_VENV, odl_home_env

    env, home = postgres_stack, Path(postgres_stack["ODL_HOME"])
    recipe = load_recipe(PROJECT_ROOT / "recipes" / "digits_fleet.toml")
    stages.prepare_data(recipe)
    split = PROJECT_ROOT / "recipes" / "data" / "digits-fleet" / "boards-2"
    a, b = f"fa{os.getpid() % 10000}", f"fb{os.getpid() % 10000}"
    with odl_home_env(home):
        boards = [
            board_up(a, venv=BOARD_VENV),
            board_up(b, venv=BOARD_VENV, env={"ODL_AGENT_STEP_DELAY_S": "0.8"}),
        ]
        try:
            for i, board in enumerate(boards):  # each board's own data, as its application would write it
                conn = connect(board)
                try:
                    conn.run(["mkdir", "-p", f"{board.root}/datasets/digits"])
                    conn.put(split / f"board-{i}.npz", f"{board.root}/datasets/digits/mine.npz")
                finally:
                    conn.close()
            save_group("duo", [a, b])
            params = {"group": "duo", "rounds": 2, "min_boards": 1, "deadline_s": 25, "epochs": 1}
            out = prefect_cli(
                env, "deployment", "run", "odl/fleet", "--param", f"params={json.dumps(params)}"
            )
            run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
            _wait("board B's round-1 job to start", lambda: _started(boards[1]), 180)
            set_link(b, False)
            rounds = lambda: sorted(home.glob("fleet/digits_fleet-duo-*/rounds.json"))  # noqa: E731
            _wait(
                "round 1 to close", lambda: rounds() and json.loads(rounds()[-1].read_text())["rounds"], 120
            )
            set_link(b, True)
            _wait("the run to end", lambda: _sql(env, f"SELECT state_type FROM flow_run WHERE id = '{run_id}'")
                  in ("COMPLETED", "FAILED", "CRASHED"), 240)  # fmt: skip
        finally:
            with odl_home_env(home):
                for name in (a, b):
                    board_down(name, purge=True)
    state = _sql(env, f"SELECT state_type || ' ' || state_name FROM flow_run WHERE id = '{run_id}'")
    assert state == "COMPLETED Completed", state  # a standard name: the UI's deployment page lists it
    summary = json.loads(rounds()[-1].read_text())
    r1, r2 = summary["rounds"]
    assert r1["took_part"] == [a] and r1["boards"][b]["status"] == "late", r1["boards"][b]
    assert r2["took_part"] == [a, b]
    assert r1["aggregate"]["accuracy"] > 0 and r2["aggregate"]["samples"] == 197
    assert r2["bytes_up"] == sum(r2["boards"][n]["bytes_up"] for n in (a, b))
    arts = _api(
        env,
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": ["odl-fleet-digits_fleet-duo".replace("_", "-")]}}},
    )
    report = next(x["data"] for x in arts if x["flow_run_id"] == run_id and "Round 2" in x["data"])
    assert (
        "cut at the deadline" in report
        and "Round 1: 1 of 2 boards" in report
        and "Round 2: 2 of 2 boards" in report
    )
