"""What the host's libraries may print: nothing a user has to read, unless it is an error.

One place for the libraries that write into the user's terminal on their own:

- ONNX Runtime's C++ logger (``CleanUnusedInitializers`` and optimizer warnings when a graph with
  Dropout or unused initializers loads): :func:`quiet_onnxruntime` sets its process-wide default
  severity to errors before any session or training ``Module`` of the host is built, and
  :func:`ort_session` builds every host inference session with the same severity.
- Libraries that log warnings straight on the root logger (onnxruntime.quantization's ``Bias ...
  has already been marked for quantization``): :func:`library_logs_at_debug` turns their records
  below ERROR into DEBUG records of one of our loggers while the library runs (``odl -v`` shows
  them), and holds the library's own named loggers at ERROR meanwhile. Our own warnings pass.

- torch's own loggers (its "No CUDA runtime is found" at the import of its C++ extension helper,
  which ONNX Runtime's training package imports): :func:`hold_torch_logs` puts them at errors
  through ``TORCH_LOGS`` before torch loads (torch resets its loggers' levels from it at import)
  and directly once it has. The ``odl`` command calls it unless ``-v``.

- Python warnings (torch's UserWarnings, a model's own ``warnings.warn``) while a recipe is
  prepared: :func:`warnings_at_debug` makes each a DEBUG record of one of our loggers.

paramiko's loggers are held by the SSH transport (``tasks.board.transport.ssh``), which uses it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

ORT_ERRORS = 3  # ONNX Runtime's severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal
# a session whose failures its caller catches and words itself (a probe of a graph that may not load
# or run, a fallback after it): ONNX Runtime's own error line would be a second, raw, copy of it
ORT_CAUGHT = 4
TORCH_ERRORS = "-torch"  # TORCH_LOGS: "-<logger>" sets it to ERROR
_ORT_QUIET: list[ModuleType] = []


def hold_torch_logs(quiet: bool) -> None:
    """torch's loggers at errors only (``quiet``), else at torch's default (warnings); a
    ``TORCH_LOGS`` the user set is theirs and left alone."""
    ours = os.environ.get("TORCH_LOGS", TORCH_ERRORS) == TORCH_ERRORS
    if not ours:
        return
    if quiet:
        os.environ["TORCH_LOGS"] = TORCH_ERRORS
    else:
        os.environ.pop("TORCH_LOGS", None)
    if "torch" in sys.modules:  # already loaded: its level was read from TORCH_LOGS then
        logging.getLogger("torch").setLevel(logging.ERROR if quiet else logging.WARNING)


def quiet_onnxruntime() -> ModuleType:
    """The ``onnxruntime`` module, its default logger at errors only (set once per process): every
    session and training ``Module`` built afterwards without its own severity logs errors only."""
    if not _ORT_QUIET:
        import onnxruntime as ort  # heavy (ORT training loads torch): only when a graph runs on the host

        ort.set_default_logger_severity(ORT_ERRORS)
        _ORT_QUIET.append(ort)
    return _ORT_QUIET[0]


def ort_session(source: str | bytes, threads: int | None = None) -> Any:
    """A CPU ``InferenceSession`` of a model file or serialized model that logs errors only;
    ``threads`` caps its intra-op threads (None: ONNX Runtime's default)."""
    ort = quiet_onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = ORT_ERRORS
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


class _RootRecordsOf(logging.Filter):
    """On the root logger: a record the package's own files logged there (``logging.warning``)
    below ERROR becomes a DEBUG record of ``to``; every other record passes."""

    def __init__(self, package: str, folder: str, to: logging.Logger) -> None:
        super().__init__()
        self.package, self.folder, self.to = package, folder, to

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or not record.pathname.startswith(self.folder):
            return True
        if self.to.isEnabledFor(logging.DEBUG):
            self.to.debug("%s: %s", self.package, record.getMessage())
        return False


@contextlib.contextmanager
def library_logs_at_debug(package: str, to: logging.Logger) -> Iterator[None]:
    """While the block runs, ``package``'s log records below ERROR (on the root logger or its own
    loggers) reach the user only as DEBUG records of ``to``; its errors and our records pass."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        yield
        return
    folder = os.path.dirname(spec.origin) + os.sep
    diverted = _RootRecordsOf(package, folder, to)
    own = logging.getLogger(package)
    level = own.level
    root = logging.getLogger()
    root.addFilter(diverted)
    own.setLevel(logging.DEBUG if to.isEnabledFor(logging.DEBUG) else logging.ERROR)
    try:
        yield
    finally:
        root.removeFilter(diverted)
        own.setLevel(level)


@contextlib.contextmanager
def warnings_at_debug(to: logging.Logger) -> Iterator[None]:
    """While the block runs, each Python warning shown (torch's ``UserWarning`` on a passing
    prepare, a model's own) is a DEBUG record of ``to`` (``odl -v`` shows it), not lines on stderr;
    the filters are the caller's, and both come back when the block ends."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:  # fmt: skip
        to.debug("%s: %s (%s:%d)", category.__name__, message, filename, lineno)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
