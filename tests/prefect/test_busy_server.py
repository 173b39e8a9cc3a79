"""A server that just started answers 503 while SQLite is busy with its own startup writes (seen
on a fresh `make teacher`: `odl stack up` failed marking the server as this home's). The stack's API
calls retry a busy answer, and give up on other errors at once."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error

import pytest

from tasks.stack.ownership import api as _api


class _Busy(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_PATCH(self) -> None:  # noqa: N802 - http.server's naming
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code)
        self.end_headers()
        if code == 200:
            self.wfile.write(json.dumps({"ok": True}).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield {"PREFECT_API_URL": f"http://127.0.0.1:{srv.server_address[1]}/api"}
    srv.shutdown()


def test_a_busy_server_is_asked_again(server):
    _Busy.answers = [503, 503, 429]
    assert _api(server, "PATCH", "/variables/name/x", {"value": 1}) == {"ok": True}
    assert _Busy.answers == []


def test_other_errors_are_not_retried(server):
    _Busy.answers = [404, 503]
    with pytest.raises(urllib.error.HTTPError) as err:
        _api(server, "PATCH", "/variables/name/x", {"value": 1})
    assert err.value.code == 404 and _Busy.answers == [503]
