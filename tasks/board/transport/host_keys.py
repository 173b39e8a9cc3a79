"""A board's pinned host keys, read from its known_hosts file once per change of the file."""

from __future__ import annotations

import threading
from pathlib import Path

import paramiko

_PINNED: dict[str, tuple[tuple[int, int], paramiko.HostKeys]] = {}
_PINNED_LOCK = threading.Lock()


def pinned_keys(known_hosts: Path, host: str, port: int) -> list[tuple[str, paramiko.PKey]]:
    """The keys ``known_hosts`` pins for ``host``:``port`` (OpenSSH's ``[host]:port`` form off port 22).
    The file is parsed once per change (size and mtime), not per connection: paramiko's loader
    compares each line with every earlier one, so a fleet's file of K boards cost O(K^2) per connection
    (26 ms at 64 boards, 750 ms at 1000: measured by bench/fleet.py)."""
    stat = known_hosts.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    with _PINNED_LOCK:
        cached = _PINNED.get(str(known_hosts))
        if cached is None or cached[0] != stamp:
            keys = paramiko.HostKeys()
            keys.load(str(known_hosts))
            cached = _PINNED[str(known_hosts)] = (stamp, keys)
    found = cached[1].lookup(host if port == 22 else f"[{host}]:{port}")
    return list(found.items()) if found else []
