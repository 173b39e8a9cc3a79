"""What the ``odl`` command prints on stderr: our own INFO lines, warnings and errors of everything
else; with ``-v`` also debug lines, library chatter (httpx, paramiko, torch, Prefect's INFO lines)
and tracebacks. Log lines go through the same rich console as the progress bars, so they never
tear a bar apart.

Prefect's INFO lines repeat what the command prints itself (the flow run's "summary:" record is the
summary ``odl flow`` prints on stdout; "Finished in state ..." its verdict; the temporary server's
address is in ``odl flow``'s first line), so they show with ``-v`` only; its warnings and errors
always show. torch's loggers are held at errors (:func:`tasks.quiet.hold_torch_logs`)."""

from __future__ import annotations

import logging
import sys

from rich.console import Console
from rich.logging import RichHandler

from tasks.quiet import hold_torch_logs

OWN = ("tasks", "flows", "device_agent")
CHATTY = ("prefect",)  # its INFO lines repeat what the bars, the summary and the first line show
_CONSOLE = [Console(stderr=True)]


def console() -> Console:
    """The console everything of the ``odl`` command writes to stderr through (log lines here, the
    progress bars of :mod:`flows.cli.progress`)."""
    return _CONSOLE[0]


class Quiet(logging.Filter):
    """Without ``-v``: no tracebacks, no INFO lines of Prefect."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        chatty = any(record.name == name or record.name.startswith(name + ".") for name in CHATTY)
        return not (record.levelno < logging.WARNING and chatty)


def setup_logging(verbose: bool) -> None:
    """Route every log record to stderr (through rich on a terminal), quiet unless ``verbose``."""
    if console().is_terminal:
        handler: logging.Handler = RichHandler(
            console=console(), show_path=False, rich_tracebacks=verbose, log_time_format="%H:%M:%S"
        )
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%H:%M:%S")
        )
    if not verbose:
        handler.addFilter(Quiet())
    handler.odl_terminal = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "odl_terminal", False)]:
        root.removeHandler(old)  # a second main() in one process (tests) replaces ours only
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)  # libraries: warnings only
    hold_torch_logs(quiet=not verbose)
    for name in OWN:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)


def error_line(exc: BaseException) -> str:
    """The one line an error is shown as (its first line; ``-v`` shows the rest)."""
    text = str(exc).strip() or type(exc).__name__
    first, _, rest = text.partition("\n")
    return first + (" (more with -v)" if rest.strip() else "")
