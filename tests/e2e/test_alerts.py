"""Alerts that reach someone and board events in view, on the session's real stack (issue 35):
without a notification no automation is installed and the status says so; with ``odl stack notify --webhook``
a silent board's alert is POSTed to the webhook (a receiver in a thread here); a report's events
link opens the UI's event feed filtered to its board (headless Chromium); the fleet overview
shows a board's last events and links the same feed."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT
from tests.e2e.prefect_api import post

pytestmark = [pytest.mark.slow, pytest.mark.board]
NONE_LINE = "alerts go nowhere until one is set: odl stack notify --webhook URL"


@pytest.fixture(scope="module")
def receiver():
    """A webhook on 127.0.0.1: its URL and the JSON bodies POSTed to it."""
    bodies: list[dict] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/hook", bodies
    srv.shutdown()


def _odl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "odl"), *args], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=180)  # fmt: skip


def _python(env: dict[str, str], code: str) -> str:
    """Run ``code`` in a process of its own (its own Prefect client, pointed at the stack)."""
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _automations(env: dict[str, str]) -> dict[str, dict]:
    return {a["name"]: a for a in post(env, "/automations/filter", {})}


def _assert_nowhere(env: dict[str, str]) -> None:
    """No odl automation on the server (one doing nothing would show an empty action in the UI)."""
    assert not [name for name in _automations(env) if name.startswith("odl: ")], _automations(env)


def test_without_a_notification_no_automation_and_the_status_says_so(prefect_stack):
    _assert_nowhere(prefect_stack)  # as `odl stack up` left the server
    status = _odl(prefect_stack, "stack", "status")
    assert status.returncode == 0 and status.stdout.splitlines()[-1] == NONE_LINE, status.stdout


def test_a_silent_boards_alert_reaches_the_webhook(prefect_stack, receiver):
    """The "board silent" automation (window 15 s here) POSTs a subject and body naming the board;
    ``--block`` sends through a block by name (a missing one: one line, alerts nowhere); ``--off``
    removes the automations."""
    url, bodies = receiver
    quick = {**prefect_stack, "ODL_BOARD_SILENT_S": "15"}
    try:
        told = _odl(quick, "stack", "notify", "--webhook", url)
        assert told.returncode == 0, told.stderr
        port = url.split(":")[2].split("/")[0]
        assert (
            told.stdout.strip()
            == f"alerts: POST to http://127.0.0.1:{port}/… (block custom-webhook/odl-alerts)"
        )
        action = _automations(prefect_stack)["odl: board silent"]["actions"][0]
        assert action["type"] == "send-notification", action
        board = f"quiet{os.getpid()}"
        _python(quick, f"from tasks.prefect import boards; boards.heartbeat({board!r}, True); boards.flush()")
        deadline, mine = time.monotonic() + 120, []
        while not mine and time.monotonic() < deadline:
            time.sleep(2)
            mine = [b for b in bodies if f"board {board} " in b.get("subject", "")]
        assert mine, f"no alert about {board} reached the webhook: {bodies}"
        assert mine[0]["subject"] == f"ODL alert: board {board} silent for 15 s"
        assert f"odl board check {board}" in mine[0]["body"]
        assert f"/events?resource=odl.board.{board}&" in mine[0]["body"]
        named = _odl(
            prefect_stack, "stack", "notify", "--block", "custom-webhook/odl-alerts"
        )  # a block by name
        assert named.stdout.strip() == "alerts: to the block custom-webhook/odl-alerts", (
            named.stdout + named.stderr
        )
        assert (
            _automations(prefect_stack)["odl: board silent"]["actions"][0]["block_document_id"]
            == action["block_document_id"]
        )
        missing = _odl(prefect_stack, "stack", "notify", "--block", "slack-webhook/nobody")
        assert missing.returncode != 0 and missing.stderr.strip().endswith(
            "alerts go nowhere: block slack-webhook/nobody not found on the server: odl stack notify --block TYPE/NAME"
        ), missing.stderr
        _assert_nowhere(prefect_stack)  # the webhook's automations removed
    finally:
        off = _odl(prefect_stack, "stack", "notify", "--off")
    assert off.returncode == 0 and off.stdout.strip() == NONE_LINE, off.stdout + off.stderr
    _assert_nowhere(prefect_stack)


def _stored(env: dict[str, str], board: str, event: str) -> bool:
    body = {"filter": {"event": {"name": [event]}, "resource": {"id": [f"odl.board.{board}"]}}, "limit": 5}
    return bool(post(env, "/events/filter", body)["events"])


def test_the_reports_events_link_opens_the_boards_feed(prefect_stack, tmp_path):
    """Two boards' events on the server; the link a report of one renders opens the UI's event
    feed showing that board's ``odl.*`` events and not the other's; the overview row shows them."""
    from tasks.judge.registry import decide
    from tasks.judge.report import ReportInput, render_report
    from tasks.recipe.extras import PromotionSpec

    seen, other = f"seen{os.getpid()}", f"other{os.getpid()}"
    _python(prefect_stack, "from tasks.prefect import boards\n"
            f"boards.heartbeat({seen!r}, True); boards.emit('odl.job.started', {seen!r})\n"
            f"boards.heartbeat({other!r}, True); boards.flush()")  # fmt: skip
    deadline = time.monotonic() + 30
    while not (
        _stored(prefect_stack, seen, "odl.job.started")
        and _stored(prefect_stack, other, "odl.board.heartbeat")
    ):
        assert time.monotonic() < deadline, "the boards' events were not stored"
        time.sleep(1)
    out = _python(prefect_stack, "import json, time; from tasks.judge.registry import Registry\n"
                  "from tasks.prefect import boards\n"
                  f"rows = boards.publish_overview([{seen!r}, {other!r}], Registry({str(tmp_path)!r}))\n"
                  f"print(json.dumps([boards.events_link({seen!r}, time.time()), rows]))")  # fmt: skip
    link, rows = json.loads(out.strip().splitlines()[-1])
    *recent, feed = rows[0]["events"].split(
        "<br>"
    )  # its last events (newest first), one a line, then the feed
    assert recent[0].startswith("job.started ") and any(e.startswith("board.heartbeat ") for e in recent), (
        rows[0]
    )
    assert feed.startswith("[event feed](http://127.0.0.1:") and f"odl.board.{seen}&" in feed, rows[0]
    spec = PromotionSpec(metric="accuracy", min_gain=0.0, significance=None)
    metrics = {"candidate": {"accuracy": 0.9}, "base": {"accuracy": 0.5}}
    report = render_report(ReportInput(recipe="digits", board=seen, flow_run_id="fr", job_id="job", test_set="t.npz",
                                       evaluations=metrics, version="v0001", events_url=link,
                                       decision=decide(metrics["candidate"], metrics["base"], spec, "base")))  # fmt: skip
    url = re.search(r"\[the board's events around this run\]\((http[^)]+)\)", report).group(1)
    dom = _page(url, tmp_path)
    listed = re.findall(r'description__event">([^<]+)<.*?event-resource-icon-text[^>]*><span>([^<]+)<', dom)
    assert ("odl.job.started", f"odl.board.{seen}") in listed, dom[
        -3000:
    ]  # the feed's items: (event, resource)
    assert {resource for _, resource in listed} == {f"odl.board.{seen}"}, listed


def _page(url: str, tmp_path: Path) -> str:
    """The DOM of ``url`` as headless Chromium renders it (as tests/e2e/test_stack.py runs it)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed (deploy/system-packages.txt lists it; run make install)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chrome'}", "--window-size=1400,1000", "--virtual-time-budget=15000"]  # fmt: skip
    return subprocess.run(
        [chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120
    ).stdout
