"""Who is asking: a pull-mode request's signature checked against the board's enrolled key.

Every board request carries its board's name, its time, a nonce and an ECDSA P-256 signature of
:func:`device_agent.pull.contract.signed_text` made by the board's own key (``openssl`` on the
board; the private key never leaves it). :func:`verify` refuses, each in one line: a malformed
header, a time off by more than ``MAX_SKEW_S`` (a replay from long ago, or a board whose clock is
wrong: the line says which way), an unknown, pending or revoked board, a signature that does not
verify with that board's key (a board presenting another board's name), and a nonce the board
used already (a replay). Verified with ``cryptography`` (maintained, and already paramiko's).
"""

from __future__ import annotations

import base64
import binascii
import functools
import time
from collections.abc import Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from device_agent.pull.contract import (
    H_BOARD,
    H_NONCE,
    H_SIGNATURE,
    H_TIME,
    MAX_SKEW_S,
    NONCE_RE,
    signed_text,
)
from tasks.board.inventory import BOARD_NAME
from tasks.board.pull.mailbox import Mailbox, Refused


def public_key(pem: str) -> ec.EllipticCurvePublicKey:
    """The P-256 public key of a PEM text, else Refused (400) naming what it is (parsed once per
    text: every signed request of a board verifies with the same key)."""
    return _parsed_key(pem)


@functools.lru_cache(maxsize=4096)
def _parsed_key(pem: str) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except (ValueError, TypeError) as exc:
        raise Refused(400, f"public_key: expected a PEM public key ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise Refused(400, f"public_key: expected an EC P-256 key, got {type(key).__name__}")
    return key


def key_fingerprint(pem: str) -> str:
    """What an operator compares before ``odl board accept``: sha256 of the key's DER bytes."""
    der = public_key(pem).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = hashes.Hash(hashes.SHA256())
    digest.update(der)
    return "sha256:" + digest.finalize().hex()


def check_signature(pem: str, method: str, path: str, headers: Mapping[str, str], body: bytes) -> None:
    """Refused (401) unless the request's signature verifies with the key ``pem``."""
    board, ts, nonce = headers[H_BOARD], headers[H_TIME], headers[H_NONCE]
    try:
        sig = base64.b64decode(headers[H_SIGNATURE], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Refused(401, f"{H_SIGNATURE}: expected base64 ({exc})") from exc
    try:
        public_key(pem).verify(
            sig, signed_text(method, path, board, ts, nonce, body), ec.ECDSA(hashes.SHA256())
        )
    except InvalidSignature as exc:
        raise Refused(401, f"the request's signature does not verify with board {board}'s key") from exc


def signed_fields(headers: Mapping[str, str], now: float) -> tuple[str, float, str]:
    """The board, time and nonce of a request's headers, each checked, else Refused (401)."""
    for name in (H_BOARD, H_TIME, H_NONCE, H_SIGNATURE):
        if not headers.get(name):
            raise Refused(401, f"{name}: missing (every request is signed by its board)")
    board = headers[H_BOARD]
    if not BOARD_NAME.ok(board):
        raise Refused(401, f"{H_BOARD}: {board!r} is not a board name")
    try:
        ts = float(int(headers[H_TIME]))
    except ValueError as exc:
        raise Refused(401, f"{H_TIME}: expected Unix seconds, got {headers[H_TIME]!r}") from exc
    if abs(ts - now) > MAX_SKEW_S:
        way = "behind" if ts < now else "ahead of"
        raise Refused(401, f"the request's time is {abs(ts - now):.0f} s {way} the host's (at most "
                           f"{MAX_SKEW_S} s): a replay, or the board's clock is wrong")  # fmt: skip
    if not NONCE_RE.match(headers[H_NONCE]):
        raise Refused(401, f"{H_NONCE}: expected 32 hex digits")
    return board, ts, headers[H_NONCE]


def verify(mailbox: Mailbox, method: str, path: str, headers: Mapping[str, str], body: bytes) -> str:
    """The name of the accepted board that signed this request, else Refused with its status."""
    board, ts, nonce = signed_fields(headers, time.time())
    record = mailbox.board(board)
    if record is None or record.public_key is None:
        raise Refused(401, f"board {board} has not enrolled")
    if record.state == "revoked":
        raise Refused(403, f"board {board} is revoked")
    check_signature(record.public_key, method, path, headers, body)
    if record.state != "accepted":
        raise Refused(403, f"board {board} is {record.state}: an operator must `odl board accept {board}`")
    if not mailbox.remember_nonce(board, nonce, ts):
        raise Refused(401, "the request's nonce was used already: a replay")
    return board
