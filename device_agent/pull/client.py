"""The board's HTTPS client for pull mode: one kept-alive connection to the pinned endpoint, every
request signed (:mod:`device_agent.pull.contract`), retried when the link drops or the host is busy.

**The pin.** The operator gives the endpoint's certificate pin at enrolment (``sha256:`` and the
hash of its DER bytes). On first contact the client fetches the certificate without verifying it
(a bare TLS handshake: no request is sent), refuses it in one line when its pin differs (exit
UNTRUSTED), and stores it as ``ROOT/pull/endpoint.pem``. From then on every connection verifies the
TLS chain against that one file (no host name check: the pin is exact) and compares the peer's
certificate with the pin again before a byte of a request goes out; a host that now presents another
certificate is refused (UNTRUSTED), never retried.

**Retries.** A connection that fails or drops is closed and opened again, with exponential backoff
and jitter up to :data:`BACKOFF_CAP_S`, :data:`RETRY_ATTEMPTS` tries in all (then one line, exit
ENVIRONMENT; the service tries again at its next check-in). 429 and 503 are waited out: their
``Retry-After`` (at most :data:`RETRY_AFTER_CAP_S`) plus jitter. Every try is signed anew (a fresh
time and nonce: the host refuses a nonce it has seen). Standard library only.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import random
import secrets
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from device_agent.atomic import atomic_write
from device_agent.errors import AgentError
from device_agent.protocol import ExitCode
from device_agent.pull.config import PullConfig, check_endpoint
from device_agent.pull.contract import H_BOARD, H_NONCE, H_SIGNATURE, H_TIME, PREFIX, cert_pin, signed_text
from device_agent.pull.identity import Identity, pull_dir

log = logging.getLogger("device_agent.pull")
ENDPOINT_PEM = "endpoint.pem"
RETRY_ATTEMPTS = 5  # tries of one request before it fails in one line
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
RETRY_AFTER_CAP_S = 600.0  # the longest Retry-After the board honours
TIMEOUT_S = 60.0  # connect, and each read of a socket
BUSY = (429, 503)


def backoff_s(attempt: int) -> float:
    """The wait after failed try ``attempt`` (0, 1, ...): doubling from 1 s up to the cap, 50-100 % of it."""
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt) * random.uniform(0.5, 1.0)


def retry_after_s(value: str | None) -> float:
    """The wait a 429/503 asks for (seconds; a date or nothing: 1 s), capped, plus up to 10 % + 0.5 s of jitter."""
    try:
        wait = float(value or "")
    except ValueError:
        wait = BACKOFF_BASE_S
    wait = min(max(wait, 0.0), RETRY_AFTER_CAP_S)
    return wait + random.uniform(0.0, 0.1 * wait + 0.5)


def untrusted(line: str) -> AgentError:
    return AgentError(ExitCode.UNTRUSTED, line)


def fetch_certificate(host: str, port: int, pin: str, dest: Path) -> None:
    """First contact: the endpoint's certificate, unverified, kept in ``dest`` only when its pin is ``pin``."""
    try:
        pem = ssl.get_server_certificate((host, port), timeout=TIMEOUT_S)
    except (OSError, ssl.SSLError) as exc:
        raise AgentError(
            ExitCode.ENVIRONMENT, f"endpoint https://{host}:{port}: cannot fetch its certificate: {exc}"
        ) from exc
    got = cert_pin(ssl.PEM_cert_to_DER_cert(pem))
    if got != pin:
        raise untrusted(
            f"endpoint https://{host}:{port}: its certificate is {got}, not the pin {pin}: refused, nothing sent"
        )
    atomic_write(dest, pem)


def pinned_context(pem: Path) -> ssl.SSLContext:
    """TLS that trusts exactly the stored certificate (a self-signed leaf; no host name check)."""
    ctx = ssl.create_default_context(cafile=str(pem))
    ctx.check_hostname = False
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the pinned leaf is the trust anchor
    ctx.verify_flags &= ~ssl.VERIFY_X509_STRICT  # the pin is exact: a lax extension is no risk
    return ctx


class PinnedConnection(http.client.HTTPSConnection):
    """An HTTPS connection that checks the peer's certificate pin on every (re)connect."""

    def __init__(self, host: str, port: int, pin: str, context: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=TIMEOUT_S, context=context)
        self.pin = pin

    def connect(self) -> None:
        where = f"endpoint https://{self.host}:{self.port}"
        try:
            super().connect()
        except ssl.SSLCertVerificationError as exc:
            raise untrusted(
                f"{where}: its certificate is not the pinned one ({exc.verify_message}): refused"
            ) from exc
        got = cert_pin(self.sock.getpeercert(binary_form=True) or b"")  # type: ignore[union-attr]
        if got != self.pin:
            self.close()
            raise untrusted(
                f"{where}: its certificate is {got}, not the pin {self.pin}: refused, nothing sent"
            )


@dataclass
class Answer:
    """A response read whole: its status and its JSON object (``{"error": text}`` when not JSON)."""

    status: int
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> str:
        return str(self.data.get("error") or f"HTTP {self.status}")

    @classmethod
    def parse(cls, status: int, raw: bytes) -> Answer:
        try:
            data = json.loads(raw) if raw.strip() else {}
        except ValueError:
            data = None
        if not isinstance(data, dict):
            lines = raw.decode(errors="replace").strip().splitlines()
            data = {"error": lines[0][:300] if lines else ""}
        return cls(status, data)


class Client:
    """Signed requests to one endpoint over one kept-alive connection."""

    def __init__(self, root: Path, config: PullConfig, *, identity: Identity | None = None,
                 sleep: Callable[[float], None] = time.sleep, attempts: int = RETRY_ATTEMPTS) -> None:  # fmt: skip
        self.config = config
        self.identity = identity or Identity(root)
        self.host, self.port = check_endpoint(config.endpoint)
        self.pem = pull_dir(root) / ENDPOINT_PEM
        self.sleep = sleep
        self.attempts = attempts
        self._conn: PinnedConnection | None = None

    def _connection(self) -> PinnedConnection:
        if self._conn is None:
            if not self.pem.is_file():
                fetch_certificate(self.host, self.port, self.config.pin, self.pem)
            self._conn = PinnedConnection(self.host, self.port, self.config.pin, pinned_context(self.pem))
        return self._conn

    def close(self) -> None:
        """Drop the connection (the next request opens a new one, its pin checked again)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def signed_headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        """The contract's four headers for one try of a request."""
        ts, nonce = str(int(time.time())), secrets.token_hex(16)
        signature = self.identity.sign(signed_text(method, path, self.config.name, ts, nonce, body))
        return {H_BOARD: self.config.name, H_TIME: ts, H_NONCE: nonce,
                H_SIGNATURE: base64.b64encode(signature).decode()}  # fmt: skip

    def open(self, method: str, route: str, body: bytes = b"", *, query: dict[str, Any] | None = None,
             headers: dict[str, str] | None = None) -> http.client.HTTPResponse:  # fmt: skip
        """Send a request (retried as the module says); the response, its body not read yet."""
        return self._exchange(method, route, body, query, headers, read=False)[0]

    def call(self, method: str, route: str, body: bytes | dict[str, Any] = b"", *,
             query: dict[str, Any] | None = None) -> Answer:  # fmt: skip
        """Send a request (a dict body as JSON) and read its answer whole."""
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(body, dict):
            body, headers = json.dumps(body, sort_keys=True).encode(), {"Content-Type": "application/json"}
        resp, raw = self._exchange(method, route, body, query, headers, read=True)
        return Answer.parse(resp.status, raw)

    def _exchange(self, method: str, route: str, body: bytes, query: dict[str, Any] | None,
                  headers: dict[str, str] | None, read: bool) -> tuple[http.client.HTTPResponse, bytes]:  # fmt: skip
        path = PREFIX + route + (f"?{urlencode(query)}" if query else "")
        for attempt in range(self.attempts):
            last = attempt + 1 == self.attempts
            try:
                conn = self._connection()
                conn.request(method, path, body=body, headers={**(headers or {}),
                                                               **self.signed_headers(method, path, body)})  # fmt: skip
                resp = conn.getresponse()
                raw = resp.read() if read or resp.status in BUSY else b""
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if last:
                    raise AgentError(ExitCode.ENVIRONMENT, f"endpoint {self.config.url}: {method} {route}: {why} "
                                                           f"({self.attempts} tries)") from exc  # fmt: skip
                wait = backoff_s(attempt)
                log.info(
                    "endpoint %s: %s %s: %s; trying again in %.1f s",
                    self.config.url,
                    method,
                    route,
                    why,
                    wait,
                )
                self.sleep(wait)
                continue
            if resp.status in BUSY and not last:
                wait = retry_after_s(resp.getheader("Retry-After"))
                log.info("endpoint %s is busy (%d): waiting %.1f s", self.config.url, resp.status, wait)
                self.sleep(wait)
                continue
            return resp, raw
        raise AssertionError("unreachable")  # the last try returns or raises
