"""Content hashes shared by every stage: the one sha256 of the host-board contract."""

from __future__ import annotations

from device_agent.protocol import file_sha256

__all__ = ["file_sha256"]
