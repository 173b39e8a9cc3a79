"""The host endpoint pull-mode boards dial: the routes of :mod:`device_agent.pull.contract` over
the :class:`~tasks.board.pull.mailbox.Mailbox`, as a Starlette app (an ASGI framework, maintained,
already installed with Prefect's server) that uvicorn serves over TLS (:mod:`tasks.stack.endpoint`).

Every route but ``enrol`` takes a request signed by an accepted board (:func:`trust.verify`) and
concerns that board's own jobs only. A refusal is its status and ``{"error": "one line"}``; the
board logs the line. More than ``max_inflight`` requests at once are answered 429 with
``Retry-After`` (the board backs off with jitter), before anything is read or verified; a body
larger than a contract chunk is refused (413) before it is read whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool as off_loop
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from device_agent.protocol import SpecError, valid_blob_name, valid_job_id
from device_agent.pull.contract import CHUNK, H_BOARD, LONG_POLL_S, PREFIX, SLEEP_BOUNDS_S
from tasks.board.pull import trust
from tasks.board.pull.mailbox import Mailbox, Refused
from tasks.errors import StoreError

log = logging.getLogger(__name__)

MAX_BODY = CHUNK + 64 * 1024  # a chunk of an output, or a result / events that large at most
MAX_INFLIGHT = 64  # requests served at once before the endpoint answers 429
RETRY_AFTER_S = 5
TICK_S = 0.5  # how often held check-ins look for work


def _error(status: int, line: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": line, **extra}, status_code=status)


async def _body(request: Request) -> bytes:
    declared = int(request.headers.get("content-length") or 0)
    if declared > MAX_BODY:
        raise Refused(413, f"request body of {declared} bytes: at most {MAX_BODY}")
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY:
            raise Refused(413, f"request body over {MAX_BODY} bytes")
    return body


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(body or b"{}")
    except ValueError as exc:
        raise Refused(400, f"{what}: expected a JSON object ({exc})") from exc
    if not isinstance(value, dict):
        raise Refused(400, f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


def _int(request: Request, name: str) -> int:
    raw = request.query_params.get(name, "")
    if not raw.isdigit():
        raise Refused(400, f"query {name}: expected a non-negative integer, got {raw!r}")
    return int(raw)


def build_app(mailbox: Mailbox, max_inflight: int = MAX_INFLIGHT) -> ASGIApp:
    """The endpoint's ASGI app over ``mailbox``."""

    waiters = Waiters(mailbox)

    async def signed(request: Request) -> tuple[str, bytes]:
        body = await _body(request)
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        board = await off_loop(trust.verify, mailbox, request.method, path, request.headers, body)
        return board, body

    async def enrol(request: Request) -> Response:
        body = await _body(request)
        msg = _json(body, "enrol")
        name, pem, code = msg.get("name"), msg.get("public_key"), msg.get("code")
        if not isinstance(pem, str) or name != request.headers.get(H_BOARD):
            raise Refused(400, f"enrol: expected name (equal to {H_BOARD}) and public_key (PEM)")
        path = request.url.path
        trust.signed_fields(request.headers, time.time())
        trust.check_signature(pem, request.method, path, request.headers, body)  # it holds the key it sends
        if code is not None and not isinstance(code, str):
            raise Refused(400, "enrol: code must be a string")
        info = msg.get("info") if isinstance(msg.get("info"), dict) else None
        state = await off_loop(mailbox.enrol, str(name), pem, code, info)
        log.info("board %s enrolled: %s", name, state)
        if state == "pending":
            return JSONResponse({"state": state, "sleep_s": 30.0}, status_code=202)
        return JSONResponse({"state": state})

    async def poll(request: Request) -> Response:
        board, body = await signed(request)
        msg = _json(body, "poll")
        info = msg.get("info") if isinstance(msg.get("info"), dict) else None
        wait_s = msg.get("wait_s") if isinstance(msg.get("wait_s"), int | float) else 0.0
        work, sleep_s, busy = await off_loop(mailbox.poll, board, info)
        if not work and wait_s > 0 and not busy:  # idle: hold it
            request.scope.get("release", lambda: None)()  # a held check-in is not load
            if await waiters.wait(board, min(float(wait_s), LONG_POLL_S)):
                record = await off_loop(mailbox.board, board)
                if record is None or record.state == "revoked":  # revoked while it waited
                    raise Refused(403, f"board {board} is revoked")
                work, sleep_s, _ = await off_loop(mailbox.poll, board, None)
            if not work:
                sleep_s = SLEEP_BOUNDS_S[0]  # the hold was the wait: check in again at once
        low, high = SLEEP_BOUNDS_S
        return JSONResponse({"sleep_s": min(high, max(low, sleep_s)), "work": work})

    async def blob(request: Request) -> Response:
        board, _ = await signed(request)
        sha = _name(valid_blob_name, request.path_params["sha"])
        return FileResponse(await off_loop(mailbox.may_fetch, board, sha))  # answers Range: bytes=N- with 206

    async def events(request: Request) -> Response:
        board, body = await signed(request)
        job_id = _name(valid_job_id, request.path_params["job"])
        offset = await off_loop(mailbox.append_events, board, job_id, _int(request, "offset"), body)
        return JSONResponse({"offset": offset})

    async def files(request: Request) -> Response:
        board, body = await signed(request)
        job_id = _name(valid_job_id, request.path_params["job"])
        sha = _name(valid_blob_name, request.path_params["sha"])
        if request.method == "GET":
            return JSONResponse({"offset": await off_loop(mailbox.upload_offset, board, job_id, sha)})
        size, offset = _int(request, "size"), _int(request, "offset")
        return JSONResponse(await off_loop(mailbox.put_chunk, board, job_id, sha, offset, size, body))

    async def result(request: Request) -> Response:
        board, body = await signed(request)
        job_id = _name(valid_job_id, request.path_params["job"])
        job = await off_loop(mailbox.finish, board, job_id, body.decode(errors="replace"))
        log.info("board %s: job %s %s", board, job.id, job.state)
        return JSONResponse({"state": job.state})

    async def work(request: Request) -> Response:
        board, body = await signed(request)
        work_id = _name(valid_job_id, request.path_params["id"])
        job = await off_loop(mailbox.answer, board, work_id, _json(body, "answer"))
        return JSONResponse({"state": job.state})

    routes = [
        Route(PREFIX + "enrol", enrol, methods=["POST"]),
        Route(PREFIX + "poll", poll, methods=["POST"]),
        Route(PREFIX + "blobs/{sha}", blob, methods=["GET"]),
        Route(PREFIX + "jobs/{job}/events", events, methods=["POST"]),
        Route(PREFIX + "jobs/{job}/files/{sha}", files, methods=["GET", "PUT"]),
        Route(PREFIX + "jobs/{job}/result", result, methods=["POST"]),
        Route(PREFIX + "work/{id}", work, methods=["POST"]),
    ]
    handlers = {Refused: _refused, SpecError: _malformed, StoreError: _store_down}
    app = Starlette(routes=routes, exception_handlers=handlers)
    return Throttle(app, max_inflight)


def _name(check: Any, value: str) -> str:
    try:
        return check(value)
    except SpecError as exc:
        raise Refused(400, str(exc)) from exc


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    log.info("refused %s %s (%s): %s", request.method, request.url.path, exc.status, exc)
    return _error(exc.status, str(exc), **exc.extra)


async def _malformed(request: Request, exc: Exception) -> Response:
    return _error(400, str(exc))


async def _store_down(request: Request, exc: Exception) -> Response:
    """The shared store out of reach (or a blob of it damaged): 503, which the board waits out; the
    line it reads does not name the store (the host's log does)."""
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    reply = _error(503, "the host's shared store is unavailable: try again later")
    reply.headers["Retry-After"] = str(RETRY_AFTER_S)
    return reply


class Waiters:
    """Held check-ins of idle boards: one mailbox query every ``TICK_S`` for all of them wakes those
    whose board has work (a run, on any host, submits to the mailbox, never to this process)."""

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        self.events: dict[str, asyncio.Event] = {}
        self.ticker: asyncio.Task[None] | None = None

    async def wait(self, board: str, seconds: float) -> bool:
        """Hold until ``board`` has work (True) or ``seconds`` pass (False)."""
        event = self.events.setdefault(board, asyncio.Event())
        if self.ticker is None or self.ticker.done():
            self.ticker = asyncio.get_running_loop().create_task(self._tick())
        try:
            await asyncio.wait_for(event.wait(), seconds)
            return True
        except TimeoutError:
            return False
        finally:
            if self.events.get(board) is event:
                del self.events[board]

    async def _tick(self) -> None:
        while self.events:
            await asyncio.sleep(TICK_S)
            busy = await off_loop(self.mailbox.boards_with_work)
            for board in busy & set(self.events):
                self.events[board].set()


TALLY_S = 60.0  # how often the endpoint logs the requests it served, by route


class Throttle:
    """ASGI middleware: 429 with ``Retry-After`` once ``limit`` requests are in flight; and a tally of
    the requests by route, logged every :data:`TALLY_S` and at shutdown ("served 1412 requests in
    60 s: poll 610, blobs 402, ..."), what an operator sizing the endpoint reads."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit, self.inflight = app, limit, 0
        self.lock = threading.Lock()
        self.tally: dict[str, int] = {}
        self.since = time.monotonic()

    def count(self, path: str) -> None:
        route = path.removeprefix(PREFIX).split("/", 1)[0] or "?"
        route = "files" if route == "jobs" and "/files/" in path else "events" if path.endswith("/events") else (
            "result" if route == "jobs" and path.endswith("/result") else route)  # fmt: skip
        with self.lock:
            self.tally[route] = self.tally.get(route, 0) + 1
            if time.monotonic() - self.since >= TALLY_S:
                self.log_tally()

    def log_tally(self) -> None:
        """Log the tally since the last one and start another (the caller holds the lock)."""
        total = sum(self.tally.values())
        if total:
            parts = ", ".join(f"{k} {v}" for k, v in sorted(self.tally.items(), key=lambda kv: -kv[1]))
            log.info("served %d requests in %.0f s: %s", total, time.monotonic() - self.since, parts)
        self.tally, self.since = {}, time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.count(scope.get("path", ""))
        with self.lock:
            busy = self.inflight >= self.limit
            if not busy:
                self.inflight += 1
        released = False

        def release() -> None:  # a request that waits without working frees its slot
            nonlocal released
            with self.lock:
                if not released:
                    released, self.inflight = True, self.inflight - 1

        scope["release"] = release
        if busy:
            wait = RETRY_AFTER_S + random.randint(0, RETRY_AFTER_S)
            reply = _error(429, f"the endpoint is busy ({self.limit} requests at once): retry later")
            reply.headers["Retry-After"] = str(wait)
            await reply(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            release()

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's lifespan, with the tally logged once more at shutdown."""

        async def receive_and_note() -> Any:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                with self.lock:
                    self.log_tally()
            return message

        await self.app(scope, receive_and_note, send)
