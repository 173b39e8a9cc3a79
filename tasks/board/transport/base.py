"""The transport seam: what the board code needs from a connection to a board.

``Transport`` has two implementations chosen per inventory entry (``transport = "ssh"`` or
``"local"``): :class:`~tasks.board.transport.ssh.SSHTransport` (paramiko, pinned host keys) and
:class:`~tasks.board.transport.local.LocalTransport` (this machine: an agent root in a folder,
for tests and dry runs). Both run fixed argv lists (never a shell line built from input) and map
their failures into :mod:`tasks.errors` at this one boundary: ``DeviceUnreachable`` (retryable),
``HostKeyRejected``, ``RemoteCommandFailed`` (command, code, output tail), ``TransferError``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

ByteProgress = Callable[[int, int], None]  # (bytes done, bytes total) of one transfer


@dataclass(frozen=True)
class Result:
    """What a command did: truthy when it exited 0."""

    command: list[str]
    code: int
    stdout: str
    stderr: str

    def __bool__(self) -> bool:
        return self.code == 0


class Transport(Protocol):
    """What the deployment code needs from a connection to a board.

    A transport is a context manager: ``with connect(board) as conn:`` closes it on exit (the
    implementations subclass this protocol to inherit ``__enter__``/``__exit__``).
    """

    def run(
        self, argv: list[str], *, input: bytes | None = None, check: bool = True, timeout: float | None = None
    ) -> Result: ...
    def put(self, local: Path, remote: str, progress: ByteProgress | None = None) -> None: ...
    def get(self, remote: str, local: Path, progress: ByteProgress | None = None) -> None: ...
    def exists(self, remote: str) -> bool: ...
    def read_from(self, remote: str, offset: int) -> bytes: ...
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        """The open transport itself."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the transport, whatever ended the block."""
        self.close()


def quote_argv(argv: list[str]) -> str:
    """The shell command line for ``argv``, each argument quoted."""
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
    return " ".join(shlex.quote(a) for a in argv)
