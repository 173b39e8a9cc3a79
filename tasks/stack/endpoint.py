"""The pull-mode endpoint as a service of the stack: its TLS certificate, its address, its process.

Boards that can only dial out are given one address (``url``, e.g. ``https://odl.example:8443``)
and the pin of the endpoint's certificate; uvicorn (maintained, already installed with Prefect's
server) serves :func:`tasks.board.pull.endpoint.build_app` there over TLS. The certificate is made
once (``cryptography``: EC P-256, self-signed, the url's host and the listening address in its
subject names) under ``$ODL_HOME/pull/tls/`` (the key 0600) and kept: every enrolled board pinned it,
so it is never replaced behind their back. ``$ODL_HOME/pull/endpoint.json`` records ``url``,
``listen`` and ``pin`` for ``odl board enrol`` to print.

    python -m tasks.stack.endpoint --listen 0.0.0.0:8443 --url https://odl.example:8443
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import logging
import os
import socket
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from device_agent.pull.contract import cert_pin
from tasks.board.pull.endpoint import build_app
from tasks.board.pull.mailbox import Mailbox, pull_home
from tasks.stack import StackError
from tasks.stack.processes import running_pid, spawn, stop_service

SERVICE = "endpoint"
DEFAULT_PORT = 8443


@dataclass(frozen=True)
class EndpointConfig:
    """Where the endpoint listens, the address boards are given, and its certificate's pin."""

    url: str
    listen: str
    pin: str

    @property
    def host_port(self) -> tuple[str, int]:
        """``listen`` split into its host and port."""
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


def tls_paths(home: Path | None = None) -> tuple[Path, Path]:
    """The endpoint's certificate and key files."""
    tls = (home or pull_home()) / "tls"
    return tls / "endpoint.crt", tls / "endpoint.key"


def ensure_certificate(names: list[str], home: Path | None = None) -> str:
    """Make the endpoint's certificate for ``names`` (host names or addresses) unless it exists;
    its pin either way. An existing one is kept even when the names changed (boards pinned it)."""
    crt, key_file = tls_paths(home)
    if not crt.exists():
        crt.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "odl pull endpoint")])
        alt: list[x509.GeneralName] = []
        for name in dict.fromkeys(names):
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(key, hashes.SHA256())
        )  # fmt: skip
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))  # fmt: skip
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    return cert_pin(cert.public_bytes(serialization.Encoding.DER))


def configure(url: str, listen: str, home: Path | None = None) -> EndpointConfig:
    """Check ``url`` and ``listen``, make the certificate, record the three in ``endpoint.json``."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise StackError(f"endpoint url: expected https://HOST[:PORT], got {url!r}")
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise StackError(f"endpoint listen: expected HOST:PORT, got {listen!r}")
    pin = ensure_certificate([parts.hostname, host.strip("[]")], home)
    cfg = EndpointConfig(url.rstrip("/"), listen, pin)
    path = (home or pull_home()) / "endpoint.json"
    path.write_text(json.dumps(cfg.__dict__, indent=2) + "\n")
    return cfg


def endpoint_config(home: Path | None = None) -> EndpointConfig | None:
    """The recorded endpoint configuration, None before the endpoint was first configured."""
    path = (home or pull_home()) / "endpoint.json"
    if not path.is_file():
        return None
    return EndpointConfig(**json.loads(path.read_text()))


# a stop waits this long for requests in flight, then closes them: a held check-in (up to the
# contract's long poll) is cut and its board asks again, instead of the stop waiting for it
SHUTDOWN_S = 2


def serve(cfg: EndpointConfig, home: Path | None = None) -> None:
    """Serve the endpoint in this process until it is stopped (SIGTERM, SIGINT)."""
    crt, key = tls_paths(home)
    host, port = cfg.host_port
    uvicorn.run(build_app(Mailbox(home)), host=host, port=port, ssl_certfile=str(crt), ssl_keyfile=str(key),
                log_level="info", access_log=False, timeout_keep_alive=30,
                timeout_graceful_shutdown=SHUTDOWN_S)  # fmt: skip


def start(listen: str, url: str | None, home: Path, timeout: float = 30.0) -> EndpointConfig:
    """Start the endpoint as a service of the stack (``$ODL_HOME/run/endpoint.pid``, its log in
    ``logs/endpoint.log``) unless it runs; its configuration once it answers TLS handshakes."""
    cfg = configure(url or f"https://{listen}", listen, home / "pull")
    if running_pid(home, SERVICE) is None:
        env = {**os.environ, "ODL_HOME": str(home)}
        argv = [sys.executable, "-m", "tasks.stack.endpoint", "--listen", listen, "--url", cfg.url]
        spawn(env, SERVICE, argv)
    host, port = cfg.host_port
    ctx = ssl.create_default_context(cafile=str(tls_paths(home / "pull")[0]))
    ctx.check_hostname = False
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(
                (host if host not in ("0.0.0.0", "::") else "127.0.0.1", port), 2
            ) as raw:
                with ctx.wrap_socket(raw):
                    return cfg
        except OSError as exc:
            if running_pid(home, SERVICE) is None or time.monotonic() > deadline:
                raise StackError(
                    f"the endpoint did not answer on {listen} ({exc}): see {home}/logs/endpoint.log"
                ) from exc
            time.sleep(0.2)


def stop(home: Path, timeout: float = 10.0) -> bool:
    """Stop the endpoint service; whether it was running."""
    return stop_service(home, SERVICE, timeout)


def main(argv: list[str] | None = None) -> int:
    """``python -m tasks.stack.endpoint``: configure (first time) and serve the endpoint."""
    ap = argparse.ArgumentParser(prog="python -m tasks.stack.endpoint", description=__doc__.split("\n")[0])
    ap.add_argument("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", help="HOST:PORT to listen on")
    ap.add_argument("--url", help="the https:// address boards are given (default: from --listen)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = configure(args.url or f"https://{args.listen}", args.listen)
    serve(cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
