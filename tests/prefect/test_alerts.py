"""Alerts that reach someone and board events in view, without a server: the automations' actions
and descriptions with a notification block (none without), their messages rendered by Prefect's own
template engine, the alert setting kept in stack.json, the event-feed link's query, and the fleet
overview's events cells. The server side (a webhook really called, the page really filtered) is
``tests/e2e/test_alerts.py``."""

from __future__ import annotations

import json
import urllib.parse
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prefect.server.events.schemas.labelling import LabelDiver
from prefect.server.utilities.user_templates import render_user_template_sync, validate_user_template

from tasks.judge.registry import Registry
from tasks.prefect import boards
from tasks.stack import StackError, alerts
from tasks.stack.automations import AROUND_H, NAMES, SPAN_S, automations, events_page
from tasks.stack.ownership import stack_config, update_stack_config

UI = "http://127.0.0.1:4242"
TARGET = alerts.Target(
    str(uuid.uuid4()), "alerts: POST to https://hooks.example/… (block custom-webhook/odl-alerts)"
)


def _by_name(found: list[dict]) -> dict[str, dict]:
    return {a["name"]: a for a in found}


def test_without_a_block_no_automation_is_made():
    """An automation whose action does nothing shows an empty action in the UI: none is made."""
    assert automations(silent_s=60) == []
    assert automations(silent_s=60, target=alerts.Target(None, alerts.NONE_SET), ui=UI) == []
    found = automations(silent_s=60, target=TARGET, ui=UI)
    assert tuple(a["name"] for a in found) == NAMES  # the names an install replaces
    assert all(a["enabled"] and a["actions"][0]["type"] == "send-notification" for a in found)


def test_with_a_block_they_send_notifications_naming_board_and_run():
    found = _by_name(automations(silent_s=60, target=TARGET, ui=UI))
    silent = found["odl: board silent"]["actions"][0]
    assert silent["type"] == "send-notification" and silent["block_document_id"] == TARGET.block_id
    context = {"labels": LabelDiver({"prefect.resource.id": "odl.board.shelf-3"})}
    subject, body = (render_user_template_sync(silent[k], context) for k in ("subject", "body"))
    assert subject == "ODL alert: board shelf-3 silent for 60 s"
    assert "odl board check shelf-3" in body
    assert f"{UI}/events?resource=odl.board.shelf-3&type=span" in body
    failed = found["odl: nightly run failed twice"]["actions"][0]
    run = SimpleNamespace(id=uuid.uuid4(), name="digits@shelf-3 2026-01-02 03:04:05", state=None)
    for key in ("subject", "body"):
        validate_user_template(failed[key])
    subject = render_user_template_sync(failed["subject"], {"flow_run": run})
    body = render_user_template_sync(failed["body"], {"flow_run": run})
    assert subject == f"ODL alert: nightly run {run.name} failed, the second in two days"
    assert f"{UI}/runs/flow-run/{run.id}" in body and "no state message" in body
    assert TARGET.why in found["odl: board silent"]["description"]


def test_the_setting_is_checked_kept_and_shown(tmp_path):
    home = tmp_path / ".odl"
    home.mkdir()
    update_stack_config(home, db="sqlite", port=4300)
    assert alerts.status_line(home) == "alerts go nowhere until one is set: odl stack notify --webhook URL"
    for bad in ("hooks.example/x", "ftp://hooks.example/x", "https:///x", ""):
        with pytest.raises(
            StackError, match=r"^--webhook .*: expected an http:// or https:// address with a host$"
        ):
            alerts.record(home, webhook=bad)
    for bad in ("slack-webhook", "/team", "slack-webhook/", "a/b/c"):
        with pytest.raises(StackError, match=r"^--block .*: expected TYPE/NAME of a notification block"):
            alerts.record(home, block=bad)
    alerts.record(home, webhook="https://hooks.example/T0/B0/secret")
    assert stack_config(home)["port"] == 4300 and alerts.setting(home) == {
        "webhook": "https://hooks.example/T0/B0/secret"
    }
    assert alerts.status_line(home) == "alerts: POST to https://hooks.example/…, from the next odl stack up"
    update_stack_config(home, db="postgres")  # what `odl stack up` writes keeps the setting
    assert alerts.setting(home)["webhook"].endswith("/secret")
    alerts.record(home, block="slack-webhook/team")
    assert alerts.status_line(home) == "alerts: the block slack-webhook/team, from the next odl stack up"
    alerts.record(home)
    assert alerts.setting(home) == {} and "secret" not in (home / "stack.json").read_text()


def test_the_environment_setting_is_recorded_once(tmp_path):
    home = tmp_path / ".odl"
    home.mkdir()
    env = {"ODL_HOME": str(home), alerts.ENV_WEBHOOK: "http://127.0.0.1:9/hook"}
    alerts.from_environment(env)
    assert alerts.setting(home) == {"webhook": "http://127.0.0.1:9/hook"}
    alerts.from_environment({"ODL_HOME": str(home)})  # unset later: the recorded one stays
    assert alerts.setting(home) == {"webhook": "http://127.0.0.1:9/hook"}


@given(
    board=st.from_regex(r"[a-z0-9][a-z0-9_-]{0,30}", fullmatch=True),
    when=st.floats(min_value=1e9, max_value=4e9, allow_nan=False),
)
@example(board="vboard", when=1_700_000_000.0005)
@example(board="0", when=1_000_000_000.046875)  # milliseconds are cut, not rounded
def test_the_events_link_filters_the_feed_to_the_board_around_a_time(board, when):
    """The query the UI's event feed reads (its route /events: ``resource``, an id prefix, and
    the date range ``type=around`` with ``date``, ``unit``, ``quantity``, or ``type=span``)."""
    url = urllib.parse.urlsplit(events_page(UI + "/", f"odl.board.{board}", when))
    query = dict(urllib.parse.parse_qsl(url.query, strict_parsing=True))
    assert f"{url.scheme}://{url.netloc}{url.path}" == f"{UI}/events"
    assert query.pop("resource") == f"odl.board.{board}"
    date = datetime.fromisoformat(query.pop("date"))
    assert date.tzinfo is not None and -1e-6 <= when - date.timestamp() < 0.001  # to the millisecond
    assert query == {"type": "around", "unit": "hour", "quantity": str(AROUND_H)}
    span = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(events_page(UI, f"odl.board.{board}")).query))
    assert span == {"resource": f"odl.board.{board}", "type": "span", "seconds": str(-SPAN_S)}


@given(seconds=st.floats(min_value=0, max_value=400 * 86400, allow_nan=False))
@example(seconds=59.999)
@example(seconds=3600.0)
def test_an_events_age_is_the_largest_whole_unit(seconds):
    text = boards.events_cell([("odl.board.heartbeat", 1000.0)], 1000.0 + seconds)
    kind, number, unit, ago = text.split(" ")
    size = {"s": 1, "min": 60, "h": 3600, "d": 86400}[unit]
    assert kind == "board.heartbeat" and ago == "ago"
    assert int(number) * size <= seconds < (int(number) + 1) * size
    assert unit == "s" or int(number) >= 1


def test_overview_rows_show_last_events_and_link_the_feed(tmp_path, monkeypatch):
    monkeypatch.setenv("ODL_HOME", str(tmp_path / ".odl"))
    now = datetime.now(UTC).timestamp()
    events = {"a": [("odl.job.finished", now - 130), ("odl.board.heartbeat", now - 7200)]}
    rows = boards.overview_rows(["a", "b"], Registry(tmp_path / "none"), events, UI)
    feed = f"[event feed]({events_page(UI, 'odl.board.a')})"
    assert rows[0]["events"] == f"job.finished 2 min ago<br>board.heartbeat 2 h ago<br>{feed}"  # one a line
    assert rows[1]["events"] == f"[event feed]({events_page(UI, 'odl.board.b')})"
    no_ui = boards.overview_rows(["a"], Registry(tmp_path / "none"))
    assert no_ui[0]["events"] == boards.NONE and json.dumps(no_ui)
