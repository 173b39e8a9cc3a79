"""A POST to the Prefect REST API of a stack (``env["PREFECT_API_URL"]``), for the e2e tests."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from tasks.stack.ownership import auth_headers


def post(env: dict[str, str], path: str, body: dict[str, Any] | None = None) -> Any:
    """POST ``body`` as JSON to ``path`` under the stack's API; the decoded JSON answer."""
    req = urllib.request.Request(
        env["PREFECT_API_URL"] + path,
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json", **auth_headers(env)},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())
