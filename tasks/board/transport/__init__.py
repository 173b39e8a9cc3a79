"""Connections to boards behind one small interface, picked per inventory entry.

``connect(board)`` opens the transport the entry names: ``ssh`` (the default; a real or virtual
board) or ``local`` (an agent root on this machine). Everything above this package talks to a
:class:`Transport` and never to paramiko.
"""

from __future__ import annotations

from tasks.board.inventory import Board
from tasks.board.transport.base import ByteProgress, Result, Transport, quote_argv
from tasks.board.transport.local import LocalTransport

__all__ = ["Board", "LocalTransport", "ByteProgress", "Result", "Transport", "connect", "quote_argv"]


def connect(board: Board) -> Transport:
    """Open the transport ``board``'s inventory entry asks for (``ssh`` or ``local``)."""
    if board.transport == "local":
        return LocalTransport(board.name)
    from tasks.board.transport.ssh import SSHTransport  # paramiko only when a board needs it

    return SSHTransport(board)
