"""The ``odl`` command line: every pipeline stage runs from here without a Prefect server.

:mod:`flows.cli.parser` declares every command's arguments (argparse only, so ``odl --help`` is
quick); each command runs in its area's module ``flows.cli.<area>`` (``prepare``, ``home``,
``run``, ``board``, ``nightly``, ``recipe``), which imports what its commands need at its top and is
itself imported only when one of its commands runs (:func:`area_module`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import ModuleType

from flows.cli.parser import build_parser
from flows.cli.terminal import error_line, setup_logging
from tasks.errors import PipelineError
from tasks.exits import STOP_SIGNALS, Interrupted, interrupted_exit, no_collection_at_exit

__all__ = ["area_module", "build_parser", "dispatch", "main", "stop_signals_interrupt"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``odl`` console script; returns the process exit status. SIGTERM and
    SIGHUP end it as Ctrl-C does (every cleanup runs, one line, status 128 + the signal)."""
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    no_collection_at_exit()  # what the command loaded is not walked again at exit
    try:
        with stop_signals_interrupt():
            return dispatch(args)
    except PipelineError as exc:
        if args.verbose:
            logging.getLogger("flows").exception("failed")
        print(f"odl: error: {error_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        print("odl: interrupted" + (f" ({signum.name})" if signum != signal.SIGINT else ""), file=sys.stderr)
        return interrupted_exit(signum)
    except BrokenPipeError:  # `odl report ... | head -3`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """For the block, SIGTERM and SIGHUP raise :class:`~tasks.exits.Interrupted` as SIGINT raises
    KeyboardInterrupt (a signal the caller ignores, ``nohup``'s SIGHUP, stays ignored); the
    previous handlers come back afterwards. Only the main thread receives signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS if sig != signal.SIGINT}
    for sig, handler in saved.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _interrupt)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command: ``flows.cli.<args.area>.<args.handler>(args)``; its exit status."""
    return int(getattr(area_module(args.area), args.handler)(args) or 0)


def area_module(area: str) -> ModuleType:
    """The module of a command area, imported on first use: only the area of the command that runs
    is loaded (none for ``odl --help``), so a light command never pays for torch, onnx or Prefect."""
    match area:
        case "prepare":
            from flows.cli import prepare as module  # lazy: export and artifacts load torch and onnx
        case "home":
            from flows.cli import home as module  # lazy: the stack's processes and PostgreSQL, no stage
        case "hosts":
            from flows.cli import hosts as module  # lazy: namespaces and the stack's processes, no stage
        case "run":
            from flows.cli import run as module  # lazy: every stage (onnx, numpy), and Prefect for odl flow
        case "board":
            from flows.cli import board as module  # lazy: virtual boards, SSH transports, the agent
        case "nightly":
            from flows.cli import nightly as module  # lazy: the registry (numpy), the stages, board releases
        case "watch":
            from flows.cli import watch as module  # lazy: Prefect's client, to start and follow a run
        case "recipe":
            from flows.cli import recipe as module  # lazy: the recipe schema (pydantic)
        case _:
            raise ValueError(f"no command area {area!r}")
    return module
