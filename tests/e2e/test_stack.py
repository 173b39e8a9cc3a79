"""End to end: a real Prefect server + worker (tasks.stack), deployment odl/full from deploy/prefect.yaml,
`prefect deployment run odl/full`, the nightly schedule, and the report rendered in the UI (headless Chromium)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT
from tests.e2e.prefect_api import post as _api

pytestmark = [pytest.mark.slow, pytest.mark.board]
SCREENSHOTS = PROJECT_ROOT / "tests" / "artifacts"


@pytest.fixture(scope="module")
def deployment_run(prefect_stack, virtual_board):
    from tasks.stack.server import prefect_cli

    params = json.dumps({"board": virtual_board.name, "epochs": 3})
    out = prefect_cli(
        prefect_stack,
        "deployment",
        "run",
        "odl/full",
        "--param",
        f"params={params}",
        "--watch",
        "--watch-timeout",
        "300",
        timeout=330,
    )
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
    return run_id, out


def test_deployment_run_completes_and_schedule_has_upcoming_runs(prefect_stack, deployment_run):
    run_id, out = deployment_run
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
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed (deploy/system-packages.txt lists it; run make install)")
    key = f"odl-report-digits-{virtual_board.name}"
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
    found = _api(
        prefect_stack, "/artifacts/filter", {"artifacts": {"key": {"any_": [key]}}, "sort": "CREATED_DESC"}
    )
    url = f"{ui}/artifacts/artifact/{found[0]['id']}"
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120
    ).stdout
    subprocess.run([chromium, *flags, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    assert "ODL run:" in dom and "Before / after on the host test set" in dom, dom[-1500:]
    assert "data:image/png;base64" in dom
    assert Path(shot).stat().st_size > 10_000


def test_a_mistyped_parameter_is_refused_before_anything_starts(prefect_stack):
    """The issue's case: `--param 'params={"epoch": 3}'` trained the default 10 epochs. The server
    now refuses the run at creation (the deployment's parameter schema), naming the key, the close
    match and the allowed keys; no flow run is created."""
    from tasks.stack import StackError
    from tasks.stack.server import prefect_cli

    before = len(_api(prefect_stack, "/flow_runs/filter", {"limit": 200}))
    for param, field, expected in (
        ('params={"epoch": 3}', "params.epoch", "did you mean epochs?"),
        ('params={"bord": "vboard"}', "params.bord", "did you mean board?"),
        ('params={"colour": 1}', "params.colour", "a known parameter"),
        ('params={"epochs": "many"}', "params.epochs", "is not valid"),
    ):
        with pytest.raises(StackError) as err:
            prefect_cli(prefect_stack, "deployment", "run", "odl/full", "--param", param, timeout=120)
        text = " ".join(str(err.value).split())
        assert f"Validation failed for field '{field}'" in text and expected in text, text
        if "known" in expected or "mean" in expected:
            assert "(allowed: batch_size, board, epochs, lr, overrides, promotion_min_gain, recipe)" in text
    assert len(_api(prefect_stack, "/flow_runs/filter", {"limit": 200})) == before
