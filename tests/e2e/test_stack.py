"""End to end: a real Prefect server + worker (tasks.stack), deployment odl/full from deploy/prefect.yaml,
`prefect deployment run odl/full`, the nightly schedule, and the report rendered in the UI (headless Chromium)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT
from tests.e2e.prefect_api import post as _api
from tests.fixtures_board import odl_home_env

pytestmark = [pytest.mark.slow, pytest.mark.board]
SCREENSHOTS = PROJECT_ROOT / "tests" / "artifacts"


@pytest.fixture(scope="module")
def deployment_run(prefect_stack, virtual_board):
    """``odl watch odl/full`` (what ``make demo`` runs): the run created, followed, its output kept."""
    params = json.dumps({"board": virtual_board.name, "epochs": 3})
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "odl"), "watch", "odl/full", "--params", params, "--timeout", "300"],
        env=prefect_stack, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=360,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    run_id = re.search(r"/runs/flow-run/([0-9a-f-]{36})", out).group(1)
    return run_id, out, proc.returncode


def test_the_watch_prints_a_few_readable_lines(deployment_run, virtual_board):
    """The issue: make demo's terminal was 48 lines of Prefect's event stream. odl watch prints the
    run's name, one line per finished stage, training progress, the verdict and the report."""
    _, out, code = deployment_run
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) <= 25, out
    day = time.strftime("%Y-%m-%d")
    assert re.match(
        rf"run digits@{virtual_board.name} {day} \d\d:\d\d:\d\d: http://127\.0\.0\.1:", lines[0]
    ), out
    assert any(line.strip().startswith("ok   export") for line in lines), out
    assert any(line.strip().startswith("training: step") and "loss" in line for line in lines), out
    assert any(line.startswith(("Promoted: v", "Not promoted: v")) for line in lines), out
    assert re.fullmatch(r"report: http://127\.0\.0\.1:\d+/artifacts/artifact/[0-9a-f-]{36}", lines[-1]), out
    assert not [line for line in lines if re.search(r"-[0-9a-f]{3}\b", line.split(":")[0])]  # no hash names


def test_deployment_run_completes_and_schedule_has_upcoming_runs(prefect_stack, deployment_run):
    run_id, out, _ = deployment_run
    run = _api(prefect_stack, "/flow_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})[0]
    assert run["state"]["type"] == "COMPLETED", out[-2000:]
    deadline, scheduled = time.monotonic() + 90, []
    while not scheduled and time.monotonic() < deadline:
        scheduled = _api(
            prefect_stack,
            "/flow_runs/filter",
            {"flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}, "limit": 5},
        )
        time.sleep(2)
    assert scheduled, "the scheduler created no upcoming run for the nightly schedule"
    assert all(s["deployment_id"] == run["deployment_id"] for s in scheduled)


def test_report_renders_in_the_prefect_ui(prefect_stack, deployment_run, virtual_board, tmp_path):
    """The report link odl watch prints (what make demo ends on) opens the report itself: its title,
    its tables and its charts render in headless Chromium (a run's ?tab=Artifacts landed on Logs)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed (deploy/system-packages.txt lists it; run make install)")
    ui = prefect_stack["PREFECT_API_URL"].removesuffix("/api")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "prefect-report.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chrome'}",
        "--window-size=1400,1000",
        "--virtual-time-budget=15000",
    ]
    url = deployment_run[1].strip().splitlines()[-1].removeprefix("report: ")  # the link odl watch printed
    assert url.startswith(f"{ui}/artifacts/artifact/"), url
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120
    ).stdout
    subprocess.run([chromium, *flags, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    text = re.sub(r"<[^>]+>", "", dom)  # the title's names are in <code>
    assert f"ODL run: digits on {virtual_board.name}" in text, dom[-1500:]
    assert "Before / after on the host test set" in dom, dom[-1500:]
    assert "data:image/png;base64" in dom
    assert Path(shot).stat().st_size > 10_000


def test_a_mistyped_parameter_is_refused_before_anything_starts(prefect_stack):
    """The issue's case: `--param 'params={"epoch": 3}'` trained the default 10 epochs. The server
    refuses the run at creation (the deployment's parameter schema lists the known keys), naming the
    key and the allowed ones; odl watch adds the close match; no flow run is created."""
    from tasks.stack import StackError
    from tasks.stack.server import prefect_cli

    before = _runs_asked_for(prefect_stack)
    allowed = "['batch_size', 'board', 'epochs', 'lr', 'overrides', 'promotion_min_gain', 'recipe']"
    for param, field, expected in (
        ('params={"epoch": 3}', "params", f"'epoch' is not one of {allowed}"),
        ('params={"colour": 1}', "params", f"'colour' is not one of {allowed}"),
        ('params={"epochs": "many"}', "params.epochs", "is not valid"),
    ):
        with pytest.raises(StackError) as err:
            prefect_cli(prefect_stack, "deployment", "run", "odl/full", "--param", param, timeout=120)
        text = " ".join(str(err.value).split())
        assert f"Validation failed for field '{field}'" in text and expected in text, text
    inspect = prefect_cli(prefect_stack, "deployment", "inspect", "odl/full", timeout=120)
    # one list of the known keys (propertyNames), no per-key lists of typos (244 lines with them; 188 at 80 columns now)
    assert inspect.count("'propertyNames'") == 1 and len(inspect.splitlines()) < 200, inspect
    watched = _odl_cli(prefect_stack, "watch", "odl/full", "--params", '{"epoch": 3}')
    assert watched.returncode == 2 and "did you mean epochs?" in watched.stderr, watched.stderr
    assert _runs_asked_for(prefect_stack) == before


def _runs_asked_for(env) -> int:
    """Flow runs someone asked for (not those the scheduler makes for the nightly cron meanwhile)."""
    return sum(not run.get("auto_scheduled") for run in _api(env, "/flow_runs/filter", {"limit": 200}))


def _odl_cli(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "odl"), *args], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def _events(env, prefix: str, board: str) -> list[dict]:
    body = {
        "filter": {"event": {"prefix": [prefix]}, "any_resource": {"id": [f"odl.board.{board}"]}},
        "limit": 50,
    }
    return _api(env, "/events/filter", body)["events"]


def test_boards_in_prefect_events_automations_and_overview(prefect_stack, deployment_run, virtual_board):
    """The server knows the boards: a run's deployment is a heartbeat, its job and its verdict are
    events with the board as resource; with no notification set no automation is installed (with
    one: tests/e2e/test_alerts.py, test_two_homes.py); a stopped board's check says it is
    unreachable; the fleet overview has a row per board."""
    from tasks.prefect.boards import NONE
    from tasks.vboard.lifecycle import board_down, board_up
    from tests.fixtures_board import BOARD_VENV

    name = virtual_board.name
    names = {e["event"] for e in _events(prefect_stack, "odl.", name)}
    assert {"odl.board.heartbeat", "odl.job.started", "odl.job.progress", "odl.job.finished"} <= names, names
    verdicts = {e["event"] for e in _events(prefect_stack, "odl.model.", name)}
    assert verdicts & {"odl.model.promoted", "odl.model.rejected"}, verdicts
    automations = {a["name"] for a in _api(prefect_stack, "/automations/filter", {})}
    assert not {n for n in automations if n.startswith("odl: ")}, automations  # no notification set

    spare = f"x{os.getpid()}"  # a board that goes down: its next check is an unreachable event
    home = prefect_stack["ODL_HOME"]
    with odl_home_env(Path(home)):
        board_up(spare, venv=BOARD_VENV)
    try:
        assert _odl_cli(prefect_stack, "board", "check", spare).returncode == 0
        with odl_home_env(Path(home)):
            board_down(spare)
        down = _odl_cli(prefect_stack, "board", "check", "--all")
        assert f"board {spare}" in down.stdout and down.returncode != 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _events(prefect_stack, "odl.board.unreachable", spare):
            time.sleep(1)
        assert _events(prefect_stack, "odl.board.heartbeat", spare)
        assert _events(prefect_stack, "odl.board.unreachable", spare)
        found = _api(prefect_stack, "/artifacts/filter",
                     {"artifacts": {"key": {"any_": ["odl-boards"]}}, "sort": "CREATED_DESC", "limit": 1})  # fmt: skip
        rows = {r["board"]: r for r in json.loads(found[0]["data"])}
        assert rows[spare]["reachable"].startswith("NO<br>") and rows[name]["reachable"].startswith("yes<br>")
        assert rows[name]["serving"].startswith("digits v") or rows[name]["trained"] != NONE
    finally:
        with odl_home_env(Path(home)):
            board_down(spare, purge=True)
