"""The automations ``odl stack up`` installs on this home's Prefect server, about the board events of
:mod:`tasks.prefect.boards`: "a board silent for 10 minutes" (no ``odl.board.heartbeat``;
``ODL_BOARD_SILENT_S`` changes the window) and "a nightly run failed twice" (two failed runs tagged
``kind:nightly`` within two days).

Their action is ``send-notification`` to the block of :mod:`tasks.stack.alerts` (``odl stack
notify``), its subject and body naming the board or the flow run, what happened and where its events
are. With no block set none is installed: a ``do-nothing`` action is an empty box in the UI's
automations page, and ``odl stack up`` and ``status`` say instead that alerts go nowhere and the
command that sets them. Also here: the address of the UI's event feed filtered to one resource
(:func:`events_page`)."""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.stack import StackError, alerts
from tasks.stack.ownership import api, update_stack_config

SILENT_S = 600
AROUND_H = 12  # a report's events link: this many hours either side of the run
SPAN_S = 7 * 86400  # an overview's events link: the last week (the UI's longest range)
BOARD_ID = "{{ labels['prefect.resource.id'] }}"  # the silent board's resource (for_each label)
BOARD = "{{ labels['prefect.resource.id'] | replace('odl.board.', '', 1) }}"
NAMES = ("odl: board silent", "odl: nightly run failed twice")  # replaced by name at each install


def events_page(ui: str, resource_id: str, around: float | None = None) -> str:
    """The UI's event feed (route ``/events``) showing the events of ``resource_id`` (the UI
    filters by id prefix): ``AROUND_H`` hours either side of the time ``around``, else the last week."""
    query = {"resource": resource_id}
    if around is None:
        query.update(type="span", seconds=str(-SPAN_S))
    else:
        date = datetime.fromtimestamp(around, UTC).isoformat(timespec="milliseconds")
        query.update(type="around", date=date.replace("+00:00", "Z"), unit="hour", quantity=str(AROUND_H))
    return f"{ui.rstrip('/')}/events?{urllib.parse.urlencode(query)}"


def automations(
    silent_s: int | None = None, target: alerts.Target | None = None, ui: str = ""
) -> list[dict[str, Any]]:
    """The automations ``odl stack up`` installs (Prefect's AutomationCreate bodies), notifying
    ``target``'s block (``ui``: the UI address their messages link to); none without a block."""
    if target is None or target.block_id is None:
        return []
    window = int(silent_s or os.environ.get("ODL_BOARD_SILENT_S") or SILENT_S)
    board_events = events_page(ui, "RESOURCE").replace("RESOURCE", BOARD_ID)
    silent = _action(
        target,
        f"ODL alert: board {BOARD} silent for {window} s",
        f"The board {BOARD} sent no heartbeat for {window} s (board checks and runs' "
        f"deployments send them). Check it: odl board check {BOARD}\nIts events: {board_events}",
    )
    failed = _action(
        target,
        "ODL alert: nightly run {{ flow_run.name }} failed, the second in two days",
        "Two runs tagged kind:nightly failed within two days; the last: {{ flow_run.name }} "
        "({{ flow_run.state.message if flow_run.state else 'no state message' }}).\n"
        f"The run: {ui}/runs/flow-run/{{{{ flow_run.id }}}}",
    )
    return [
        {
            "name": NAMES[0],
            "description": f"a board sent no heartbeat for {window} s (odl board check, a run's deployment); {target.why}",
            "enabled": True,
            "trigger": {
                "type": "event", "posture": "Proactive", "match": {"prefect.resource.id": "odl.board.*"},
                "after": ["odl.board.heartbeat", "odl.board.unreachable"], "expect": ["odl.board.heartbeat"],
                "for_each": ["prefect.resource.id"], "threshold": 1, "within": window,
            },
            "actions": [silent],
        },
        {
            "name": NAMES[1],
            "description": f"two runs tagged kind:nightly failed within two days; {target.why}",
            "enabled": True,
            "trigger": {
                "type": "event", "posture": "Reactive", "match": {"prefect.resource.id": "prefect.flow-run.*"},
                "match_related": {"prefect.resource.id": "prefect.tag.kind:nightly"},
                "expect": ["prefect.flow-run.Failed"], "threshold": 2, "within": 2 * 86400,
            },
            "actions": [failed],
        },
    ]  # fmt: skip


def _action(target: alerts.Target, subject: str, body: str) -> dict[str, Any]:
    return {
        "type": "send-notification",
        "block_document_id": target.block_id,
        "subject": subject,
        "body": body,
    }


def install_automations(env: dict[str, str]) -> alerts.Target:
    """Replace (by name) the automations of :func:`automations`, sending to the alert block this
    home has set (``ODL_ALERT_WEBHOOK`` first recorded); with none, the old ones are removed and
    none made. Where they send, also kept in ``stack.json`` for ``odl stack status``."""
    alerts.from_environment(env)
    try:
        target = alerts.resolve(env)
        found = api(env, "POST", "/automations/filter", {"automations": {"name": {"any_": list(NAMES)}}})
        for old in found or []:
            api(env, "DELETE", f"/automations/{old['id']}")
        for body in automations(target=target, ui=env["PREFECT_API_URL"].removesuffix("/api")):
            api(env, "POST", "/automations/", body)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise StackError(f"cannot install the stack's automations: {exc} {detail}".strip()) from exc
    update_stack_config(Path(env["ODL_HOME"]), alerts_installed=alerts.line(target))
    return target
