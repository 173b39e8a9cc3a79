"""A user error (the host's error tree, :class:`tasks.errors.PipelineError`) is one ERROR line in a
run's logs, not a Python traceback.

Prefect logs a failing task or flow twice: the exception with its traceback ("Task run failed with
exception ...", "Encountered exception during execution ..."), then "Finished in state Failed(...)"
with the message. For our own errors the message already names the field and what was expected, so
that record keeps its ERROR line without the traceback, and the traceback goes to a DEBUG record
of its own (``odl -v`` and a DEBUG logging level still show it). Other exceptions (bugs) keep
their tracebacks at ERROR."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from tasks.errors import PipelineError

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "prefect.engine")
# what a board task says while it waits on a board that dials out ("waiting for NAME to check in")
BOARD_LINK_LOGGER = "tasks.board.pull.link"


class UserErrorTracebacksAtDebug(logging.Filter):
    """A record carrying a :class:`PipelineError` traceback: the line stays, the traceback moves to
    a DEBUG record of the same run."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, PipelineError) and record.levelno > logging.DEBUG:
            trace = logging.makeLogRecord(record.__dict__)
            trace.levelno, trace.levelname = logging.DEBUG, "DEBUG"
            trace.msg, trace.args = "traceback of the error above", None
            logging.getLogger(record.name).handle(trace)
            record.exc_info, record.exc_text = None, None
        return True


def quiet_user_errors() -> None:
    """Install the filter on Prefect's run loggers (once; the flows call it at import)."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, UserErrorTracebacksAtDebug) for f in logger.filters):
            logger.addFilter(UserErrorTracebacksAtDebug())


class _ToRunLog(logging.Handler):
    """Each INFO-or-above record, as a line of the current task run's log."""

    def emit(self, record: logging.LogRecord) -> None:
        from prefect.logging import get_run_logger  # inside a task run

        try:
            get_run_logger().log(record.levelno, "%s", record.getMessage())
        except Exception:  # noqa: BLE001 - outside a run: the record stays in the module's own log
            pass


@contextlib.contextmanager
def board_link_lines() -> Iterator[None]:
    """For the block, the board link's own lines (a pull board's "waiting for NAME to check in: last
    seen 3 min ago") go to the task run's log, which the UI and ``odl watch`` show."""
    logger, handler = logging.getLogger(BOARD_LINK_LOGGER), _ToRunLog(logging.INFO)
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
