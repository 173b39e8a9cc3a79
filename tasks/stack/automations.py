"""The automations ``odl stack up`` installs on this home's Prefect server, about the board events of
:mod:`tasks.prefect.boards`: "a board silent for 10 minutes" (no ``odl.board.heartbeat``;
``ODL_BOARD_SILENT_S`` changes the window) and "a nightly run failed twice" (two failed runs tagged
``kind:nightly`` within two days). Their action is ``do-nothing``: the trigger is the mark in the
UI (Automations, and a ``prefect.automation.triggered`` event in the event feed)."""

from __future__ import annotations

import os
from typing import Any

SILENT_S = 600


def automations(silent_s: int | None = None) -> list[dict[str, Any]]:
    """The automations ``odl stack up`` installs (Prefect's AutomationCreate bodies)."""
    window = int(silent_s or os.environ.get("ODL_BOARD_SILENT_S") or SILENT_S)
    return [
        {
            "name": "odl: board silent",
            "description": f"a board sent no heartbeat for {window} s (odl board check, a run's deployment)",
            "enabled": True,
            "trigger": {
                "type": "event", "posture": "Proactive", "match": {"prefect.resource.id": "odl.board.*"},
                "after": ["odl.board.heartbeat", "odl.board.unreachable"], "expect": ["odl.board.heartbeat"],
                "for_each": ["prefect.resource.id"], "threshold": 1, "within": window,
            },
            "actions": [{"type": "do-nothing"}],
        },
        {
            "name": "odl: nightly run failed twice",
            "description": "two runs tagged kind:nightly failed within two days",
            "enabled": True,
            "trigger": {
                "type": "event", "posture": "Reactive", "match": {"prefect.resource.id": "prefect.flow-run.*"},
                "match_related": {"prefect.resource.id": "prefect.tag.kind:nightly"},
                "expect": ["prefect.flow-run.Failed"], "threshold": 2, "within": 2 * 86400,
            },
            "actions": [{"type": "do-nothing"}],
        },
    ]  # fmt: skip
