"""A real pull-mode endpoint for tests: uvicorn over TLS on a loopback port, serving a mailbox in
a temporary folder, and a signer that speaks the contract with a key of its own (the host's
``cryptography``: the board's own client, with ``openssl``, is tested against the same endpoint)."""

from __future__ import annotations

import base64
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from device_agent.pull.contract import H_BOARD, H_NONCE, H_SIGNATURE, H_TIME, PREFIX, signed_text
from tasks.board.pull.endpoint import build_app
from tasks.board.pull.mailbox import Mailbox
from tasks.stack.endpoint import SHUTDOWN_S, configure, tls_paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Endpoint:
    url: str
    cert: Path
    pin: str
    mailbox: Mailbox


@contextmanager
def running_endpoint(home: Path, max_inflight: int = 64) -> Iterator[Endpoint]:
    """The endpoint served in a thread of this process until the block ends."""
    port = free_port()
    cfg = configure(f"https://127.0.0.1:{port}", f"127.0.0.1:{port}", home)
    mailbox = Mailbox(home)
    crt, key = tls_paths(home)
    server = uvicorn.Server(uvicorn.Config(build_app(mailbox, max_inflight), host="127.0.0.1", port=port,
                                           ssl_certfile=str(crt), ssl_keyfile=str(key), log_level="warning",
                                           timeout_graceful_shutdown=SHUTDOWN_S))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the endpoint did not start"
        time.sleep(0.05)
    try:
        yield Endpoint(cfg.url, crt, cfg.pin, mailbox)
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class Signer:
    """A board's credential and a client that signs each request with it."""

    name: str
    endpoint: Endpoint
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))

    @property
    def pem(self) -> str:
        return (
            self.key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )

    def headers(self, method: str, path: str, body: bytes, *, ts: int | None = None, nonce: str | None = None,
                as_board: str | None = None) -> dict[str, str]:  # fmt: skip
        board = as_board or self.name
        ts_s, nonce = str(int(time.time()) if ts is None else ts), nonce or secrets.token_hex(16)
        sig = self.key.sign(signed_text(method, path, board, ts_s, nonce, body), ec.ECDSA(hashes.SHA256()))
        return {H_BOARD: board, H_TIME: ts_s, H_NONCE: nonce, H_SIGNATURE: base64.b64encode(sig).decode()}

    def request(self, method: str, route: str, body: bytes | dict[str, Any] = b"", *, extra: dict | None = None,
                **sign: Any) -> httpx.Response:  # fmt: skip
        raw = json.dumps(body).encode() if isinstance(body, dict) else body
        path = PREFIX + route
        headers = {**self.headers(method, path, raw, **sign), **(extra or {})}
        with httpx.Client(verify=str(self.endpoint.cert), timeout=20) as client:
            return client.request(method, self.endpoint.url + path, content=raw, headers=headers)

    def enrol(self, code: str | None) -> httpx.Response:
        return self.request(
            "POST", "enrol", {"name": self.name, "public_key": self.pem, "code": code, "info": {}}
        )
