"""A small stand-in for the host's pull endpoint, to test the board's client and service against:
a real HTTPS server (``http.server`` + ``ssl``, HTTP/1.1 keep-alive, on 127.0.0.1 port 0) with a
self-signed certificate made by ``openssl req -x509``, speaking just enough of
:mod:`device_agent.pull.contract` and verifying every request's signature with ``cryptography``.

Its faults are set by the test: ``busy`` (route -> how many 429s first), ``cut_blob_at`` (a blob's
body stops after that many bytes, once), ``cut_put`` (the next ``PUT`` is read half way, its half
kept, and the connection dropped without an answer), ``refuse_poll`` (a 403 to ``poll``).

The fixtures ``endpoint`` (served for one test) and ``board`` (a board root enrolled with it, its
client's sleeps recorded, not slept) are imported by the tests that use them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from device_agent.pull.client import Client
from device_agent.pull.config import PullConfig, save_config
from device_agent.pull.contract import H_BOARD, H_NONCE, H_SIGNATURE, H_TIME, PREFIX, cert_pin, signed_text
from device_agent.pull.identity import Identity


def make_cert(folder: Path, name: str = "endpoint") -> tuple[Path, Path, str]:
    """A self-signed P-256 certificate and key for 127.0.0.1 (``openssl req -x509``); their paths and pin."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key, cert_pin(ssl.PEM_cert_to_DER_cert(cert.read_text()))


@dataclass
class Seen:
    """One request the endpoint read: method, path with query, headers, body, whether its signature verified."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool

    @property
    def route(self) -> str:
        return urlsplit(self.path).path.removeprefix(PREFIX)

    @property
    def query(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}


@dataclass
class Endpoint:
    """The endpoint's state; ``serve`` starts it."""

    folder: Path
    keys: dict[str, str] = field(default_factory=dict)  # board -> public key PEM
    seen: list[Seen] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)
    events: dict[str, bytearray] = field(default_factory=dict)
    files: dict[str, bytearray] = field(default_factory=dict)
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    work: list[dict[str, Any]] = field(default_factory=list)
    enrol_state: str = "accepted"
    sleep_s: float = 2.0
    busy: dict[str, int] = field(default_factory=dict)
    cut_blob_at: dict[str, int] = field(default_factory=dict)
    cut_put: bool = False
    refuse_poll: bool = False
    connections: int = 0

    def serve(self) -> Endpoint:
        self.cert, self.key, self.pin = make_cert(self.folder)
        self.use_cert(self.cert, self.key)
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.endpoint = self  # type: ignore[attr-defined]
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        return self

    def use_cert(self, cert: Path, key: Path) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.ctx = ctx

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def routes(self, method: str | None = None) -> list[str]:
        return [s.route for s in self.seen if method in (None, s.method)]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = super().get_request()
        self.endpoint.connections += 1  # type: ignore[attr-defined]
        return self.endpoint.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr  # type: ignore[attr-defined]

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that drops a connection (as the tests make it do) is no error here


def _verify(pem: str, seen: Seen) -> bool:
    h = seen.headers
    try:
        key = serialization.load_pem_public_key(pem.encode())
        assert isinstance(key, ec.EllipticCurvePublicKey)
        text = signed_text(seen.method, seen.path, h[H_BOARD], h[H_TIME], h[H_NONCE], seen.body)
        key.verify(base64.b64decode(h[H_SIGNATURE]), text, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, KeyError, ValueError):
        return False
    return True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._route()

    do_POST = do_PUT = do_GET

    def _reply(
        self, status: int, obj: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> None:
        body = json.dumps(obj or {}).encode()
        self.send_response(status)
        for k, v in {
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            **(headers or {}),
        }.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _route(self) -> None:
        ep: Endpoint = self.server.endpoint  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        if self.command == "PUT" and ep.cut_put:
            ep.cut_put = False
            seen = Seen(self.command, self.path, dict(self.headers), b"", False)  # its body cut: unverified
            ep.seen.append(seen)
            ep.files.setdefault(seen.route.rsplit("/", 1)[1], bytearray()).extend(
                self.rfile.read(length // 2)
            )
            self.close_connection = True
            return
        body = self.rfile.read(length)
        route = urlsplit(self.path).path.removeprefix(PREFIX)
        pem = (
            json.loads(body).get("public_key", "")
            if route == "enrol"
            else ep.keys.get(self.headers[H_BOARD], "")
        )
        seen = Seen(self.command, self.path, dict(self.headers), body, False)
        seen.verified = _verify(pem, seen)
        ep.seen.append(seen)
        if ep.busy.get(route, 0) > 0:
            ep.busy[route] -= 1
            return self._reply(429, {"error": "busy"}, {"Retry-After": "7"})
        if not seen.verified:
            return self._reply(401, {"error": "the request's signature does not verify"})
        self._answer(ep, seen)

    def _answer(self, ep: Endpoint, seen: Seen) -> None:
        route, q = seen.route, seen.query
        if route == "enrol":
            ep.keys[seen.headers[H_BOARD]] = json.loads(seen.body)["public_key"]
            return self._reply(
                202 if ep.enrol_state == "pending" else 200, {"state": ep.enrol_state, "sleep_s": 5}
            )
        if route == "poll":
            if ep.refuse_poll:
                return self._reply(403, {"error": f"board {seen.headers[H_BOARD]} is revoked"})
            work, ep.work = ep.work, [w for w in ep.work if w.get("again")]
            return self._reply(200, {"sleep_s": ep.sleep_s, "work": work})
        if m := re.fullmatch(r"blobs/(\w+)", route):
            return self._blob(ep, m.group(1))
        if m := re.fullmatch(r"jobs/([\w.-]+)/events", route):
            have = ep.events.setdefault(m.group(1), bytearray())
            if int(q["offset"]) != len(have):
                return self._reply(409, {"error": "offset", "offset": len(have)})
            have.extend(seen.body)
            return self._reply(200, {"offset": len(have)})
        if m := re.fullmatch(r"jobs/([\w.-]+)/files/(\w+)", route):
            part = ep.files.setdefault(m.group(2), bytearray())
            if seen.method == "GET":
                return self._reply(200, {"offset": len(part)})
            if int(q["offset"]) != len(part):
                return self._reply(409, {"error": "offset", "offset": len(part)})
            part.extend(seen.body)
            done = len(part) == int(q["size"])
            if done and hashlib.sha256(part).hexdigest() != m.group(2):
                del ep.files[m.group(2)]
                return self._reply(422, {"error": "its bytes do not hash to it (dropped)"})
            return self._reply(200, {"offset": len(part), "complete": done})
        if m := re.fullmatch(r"jobs/([\w.-]+)/result", route):
            ep.results.setdefault(m.group(1), []).append(json.loads(seen.body))
            return self._reply(200, {"state": json.loads(seen.body)["status"]})
        if m := re.fullmatch(r"work/([\w.-]+)", route):
            ep.answers[m.group(1)] = json.loads(seen.body)
            return self._reply(200, {"state": "finished"})
        self._reply(404, {"error": f"no route {route}"})

    def _blob(self, ep: Endpoint, sha: str) -> None:
        data = ep.blobs[sha]
        start = int(m.group(1)) if (m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))) else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        cut = ep.cut_blob_at.pop(sha, None)
        self.wfile.write(data[start:cut] if cut is not None else data[start:])
        if cut is not None:
            self.close_connection = True


def train_item(ep: Endpoint, job_id: str, upload: tuple[str, ...] = ("inference",)) -> dict[str, Any]:
    """A ``train`` item whose blobs the endpoint serves: random bytes as artifacts and data, so the job
    starts, verifies them, and fails at once loading them (a real job, ended in a second or two)."""
    from device_agent.protocol import RUNTIME_ARTIFACTS, BlobRef, DataRef, JobSpec, TrainParams

    refs = {}
    for name in (*RUNTIME_ARTIFACTS["autograd"], "data"):
        data = f"{job_id} {name} ".encode() * 50
        ep.blobs[hashlib.sha256(data).hexdigest()] = data
        refs[name] = BlobRef(hashlib.sha256(data).hexdigest(), len(data))
    spec = JobSpec(job_id=job_id, artifacts={k: v for k, v in refs.items() if k != "data"},
                   train_data=DataRef("npz", blob=refs["data"]), train=TrainParams(batch_size=4, epochs=1, lr=0.1),
                   task="classification", output_names=("logits",), runtime="autograd")  # fmt: skip
    return {"kind": "train", "id": job_id, "spec": spec.to_dict(), "upload": list(upload),
            "blobs": {r.sha256: r.size for r in refs.values()}}  # fmt: skip


BOARD = "b1"


@pytest.fixture(scope="module")
def key_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One board key for the module (openssl makes it once); each test copies it into its root."""
    root = tmp_path_factory.mktemp("key")
    Identity(root).ensure()
    return root


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    ep = Endpoint(tmp_path / "host")
    ep.folder.mkdir()
    ep.serve()
    yield ep
    ep.stop()


class Board:
    """A board root enrolled with ``endpoint`` (its key known to it), and its client with a recorded sleep."""

    def __init__(self, root: Path, key_root: Path, ep: Endpoint, pin: str | None = None) -> None:
        self.root, self.slept = root, []
        identity = Identity(root)
        identity.key.write_bytes((key_root / "pull" / "board.key").read_bytes())
        os.chmod(identity.key, 0o600)
        self.config = PullConfig(ep.url, pin or ep.pin, BOARD, "accepted")
        save_config(root, self.config)
        ep.keys[BOARD] = identity.public_pem()
        self.client = Client(root, self.config, sleep=self.slept.append)


@pytest.fixture
def board(tmp_path: Path, key_root: Path, endpoint: Endpoint) -> Iterator[Board]:
    b = Board(tmp_path / "board", key_root, endpoint)
    yield b
    b.client.close()
