"""The first item of ``odl board check``: can the host reach the board, and is its host key pinned?

The link is opened with the pipeline's own transport (:func:`tasks.board.transport.connect`), so
the check sees exactly what a deploy would; its errors say which case it is: ``HostKeyRejected`` for
a missing known_hosts file, a host that is not pinned, or a key that CHANGED; ``DeviceUnreachable``
for a refused or timed-out connection or a key the board does not accept.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from pathlib import Path

from tasks.board.check_items import FAIL, PASS, Check
from tasks.board.inventory import Board
from tasks.board.transport import Transport, connect
from tasks.errors import DeviceError, HostExit, HostKeyRejected


def host_pattern(host: str, port: int) -> str:
    """How known_hosts names ``host:port``: ``host`` on port 22, else ``[host]:port``."""
    return host if port == 22 else f"[{host}]:{port}"


def _matches(field: str, name: str) -> bool:
    for pattern in field.split(","):
        if pattern.startswith("|1|"):  # hashed: |1|base64(salt)|base64(hmac-sha1(salt, name))
            try:
                salt, digest = (base64.b64decode(p) for p in pattern[3:].split("|", 1))
            except (ValueError, binascii.Error):
                continue
            if hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest):
                return True
        elif pattern == name:
            return True
    return False


def pinned_keys(known_hosts: Path | None, host: str, port: int) -> list[str]:
    """The keys pinned for ``host:port`` as ``"ssh-ed25519 SHA256:..."`` (OpenSSH's fingerprint form)."""
    if known_hosts is None or not Path(known_hosts).is_file():
        return []
    name, keys = host_pattern(host, port), []
    for line in Path(known_hosts).read_text(errors="replace").splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith(("#", "@")) or not _matches(fields[0], name):
            continue
        try:
            blob = base64.b64decode(fields[2])
        except (ValueError, binascii.Error):
            continue
        digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
        keys.append(f"{fields[1]} SHA256:{digest}")
    return keys


def _keyscan(board: Board) -> str:
    return (
        f"ssh-keyscan -p {board.port} {board.host} >> {board.known_hosts or '~/.odl/known_hosts'} after "
        "comparing its fingerprint with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the "
        "board's console"
    )


def host_key_failure(board: Board, exc: HostKeyRejected) -> Check:
    """The FAIL for a refused host key: no known_hosts file, host not pinned, or key changed."""
    kh, code = board.known_hosts, int(exc.exit_code)
    if kh is None or not Path(kh).is_file():
        return Check("ssh", FAIL, f"no pinned known_hosts file ({kh})",
                     f"set known_hosts in the inventory entry and pin the key: {_keyscan(board)}", code)  # fmt: skip
    if "CHANGED" in str(exc):
        pinned = ", ".join(pinned_keys(kh, board.host, board.port)) or "none readable"
        forget = f"ssh-keygen -R '{host_pattern(board.host, board.port)}' -f {kh}"
        return Check(
            "ssh", FAIL, f"{exc} (pinned: {pinned})",
            f"if the board was reflashed, verify the new key on its console, then {forget} and "
            f"{_keyscan(board)}; otherwise suspect a man in the middle and do not connect", code,
        )  # fmt: skip
    return Check("ssh", FAIL, f"host key of {board.host}:{board.port} is not pinned in {kh}",
                 f"pin it: {_keyscan(board)}", code)  # fmt: skip


def link_failure(board: Board, exc: DeviceError) -> Check:
    """The FAIL for a board that cannot be reached or does not accept the key."""
    code = int(exc.exit_code)
    if "authentication failed" in str(exc):
        return Check("ssh", FAIL, str(exc), f"put {board.key}.pub into ~{board.user}/.ssh/authorized_keys on the "
                     f"board (ssh-copy-id -i {board.key}.pub -p {board.port} {board.user}@{board.host}), and "
                     "check key and user in the inventory entry", code)  # fmt: skip
    return Check("ssh", FAIL, str(exc), f"check that the board is on and reachable (ping {board.host}), that sshd "
                 f"listens on port {board.port} (systemctl status sshd on its console), and host/port in the "
                 "inventory entry", code)  # fmt: skip


def open_link(board: Board) -> tuple[Transport | None, Check]:
    """Connect to ``board`` as a deploy would: (open transport or None, the ``ssh`` item)."""
    if board.transport == "local":
        return connect(board), Check(
            "ssh", PASS, "local transport: the board root is on this machine, no SSH"
        )
    if board.key is None or not Path(board.key).is_file():
        return None, Check("ssh", FAIL, f"private key {board.key} not found",
                           "set key in the inventory entry to the private key whose .pub is in the board "
                           "user's ~/.ssh/authorized_keys (ssh-keygen -t ed25519 creates a pair)", HostExit.UNREACHABLE)  # fmt: skip
    start = time.monotonic()
    try:
        conn = connect(board)
    except HostKeyRejected as exc:
        return None, host_key_failure(board, exc)
    except DeviceError as exc:
        return None, link_failure(board, exc)
    took = time.monotonic() - start
    pinned = ", ".join(pinned_keys(board.known_hosts, board.host, board.port)) or "pinned"
    where = f"{board.user}@{board.host}:{board.port}"
    return conn, Check("ssh", PASS, f"{where} in {took:.2f} s, host key {pinned} in {board.known_hosts}")
