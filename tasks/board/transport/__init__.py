"""Connections to boards behind one small interface, picked per inventory entry.

``connect(board)`` opens the transport the entry names: ``ssh`` (the default; a real or virtual
board) or ``local`` (an agent root on this machine). Everything above this package talks to a
:class:`Transport` and never to paramiko. A transport is a context manager (``with connect(board)
as conn:`` closes it); ``connection(board, conn)`` is that, or a caller's open ``conn`` left open.
"""

from __future__ import annotations

import contextlib

from tasks.board.inventory import Board
from tasks.board.transport.base import ByteProgress, Result, Transport, quote_argv
from tasks.board.transport.local import LocalTransport
from tasks.errors import BoardError

__all__ = [
    "Board",
    "LocalTransport",
    "ByteProgress",
    "Result",
    "Transport",
    "connect",
    "connection",
    "quote_argv",
]


def connect(board: Board) -> Transport:
    """Open the transport ``board``'s inventory entry asks for (``ssh`` or ``local``)."""
    if board.transport == "local":
        return LocalTransport(board.name)
    if board.transport == "pull":
        raise BoardError(f"board {board.name} can only dial out (transport pull): the host cannot run a "
                         "command on it; it takes jobs, releases and dataset listings at its check-ins")  # fmt: skip
    from tasks.board.transport.ssh import SSHTransport  # paramiko only when a board needs it

    return SSHTransport(board)


def connection(board: Board, conn: Transport | None = None) -> contextlib.AbstractContextManager[Transport]:
    """A ``with`` block's connection to ``board``: the caller's open ``conn`` (left open after the
    block: it is the caller's to close), else a new one closed on exit."""
    return contextlib.nullcontext(conn) if conn is not None else connect(board)
