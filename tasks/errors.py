"""One error tree for the whole host side of the pipeline, its exit codes and its retry policy.

Each error's exit code, help (cause: what to do) and retry flag are written once, in
:data:`tasks.exits.HOST_EXITS`; the tree and the table below, :data:`tasks.exits.HOST_EXIT_HELP`, each class's ``exit_code``,
``retryable`` and the first line of its docstring (:func:`host_error`) are rendered from it, and
``tests/test_errors.py`` holds the manual's table (docs/reference/exit-codes.md) equal to it. Callers catch at the level they care
about::

{tree}

**Retry policy** (the one place that decides): :func:`should_retry` for host errors (only the
classes marked ``retryable``: link down, timeout, transfer) — used by the Prefect tasks, the blob
upload and the event follower; :func:`agent_exit_retryable` for a job that ended on the board
(every agent exit code but ``device_agent.protocol.NEVER_RETRY``) — used to decide whether a job
runs again.

**Exit codes** of ``odl`` (:class:`HostExit`), 50-79, apart from the agent's (0-49, see
``device_agent/README.md``): each error class exits with its own code.

{table}

Other statuses: 0 success; 1 an error outside this tree (a bug prints its traceback; ``odl report``
finds no report); 2 a command-line usage error; 128 + the signal when stopped by Ctrl-C, SIGTERM
or SIGHUP (130, 143, 129: one line, every cleanup run, no ``.partial`` folder left).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from device_agent.protocol import NEVER_RETRY
from tasks.exits import EXIT_INFO, HostExit, error_tree, exit_table

E = TypeVar("E", bound=type)


__doc__ = (__doc__ or "").replace("{tree}", error_tree()).replace("{table}", exit_table())


def host_error(code: HostExit) -> Callable[[E], E]:
    """Give an error class its exit ``code``, retry flag and, as its docstring's first line, the
    cause, all from :data:`HOST_EXITS` (whose entry must name the class)."""

    def mark(cls: E) -> E:
        info = EXIT_INFO[code]
        if cls.__name__ != info.error:
            raise TypeError(f"HOST_EXITS gives {code.name} to {info.error}, not {cls.__name__}")
        cls.exit_code = code
        cls.retryable = info.retryable
        own = f"\n\n{cls.__doc__}" if cls.__doc__ else ""
        cls.__doc__ = f"{info.cause[0].upper()}{info.cause[1:]}.{own}"
        return cls

    return mark


@host_error(HostExit.PIPELINE)
class PipelineError(Exception):
    """Base of every error the pipeline raises on purpose."""

    retryable: bool  # set with exit_code by @host_error, from HOST_EXITS
    exit_code: int


@host_error(HostExit.RECIPE)
class RecipeError(PipelineError):
    """The message names the field and what was expected."""

    def __init__(self, field: str, expected: str, got: object = None, *, source: str = "") -> None:
        self.field = field
        self.expected = expected
        self.got = got
        where = f"{source}: " if source else ""
        got_txt = "" if got is None else f" (got {got!r})"
        super().__init__(f"{where}recipe field '{field}': expected {expected}{got_txt}")


@host_error(HostExit.MODEL)
class ModelError(PipelineError):
    """Built from the recipe's model entry: torchvision, a module:callable or an ONNX file."""


@host_error(HostExit.ARTIFACT)
class ArtifactError(PipelineError):
    """ORT training artifacts for a board with ORT 1.19.2."""


@host_error(HostExit.VALIDATION)
class ValidationFailed(PipelineError):
    """The offline dry-run of a recipe failed one of its checks."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        self.report: dict | None = None  # validation's figures up to the failure, when it ran
        super().__init__(f"validation check '{check}' failed: {message}")


@host_error(HostExit.DATA)
class DataError(PipelineError):
    """Missing, or not matching the model: shape, dtype, label range, NaN."""


@host_error(HostExit.NO_NEW_DATA)
class NoNewData(DataError):
    """No file, or none new: a nightly run ends as "No new data" rather than failing."""


@host_error(HostExit.BOARD)
class BoardError(PipelineError):
    """An inventory entry or the virtual board is wrong or unusable."""


@host_error(HostExit.INVALID_JOB)
class InvalidJob(PipelineError):
    """A job id or job spec is unsafe or conflicts with the job already on the board; never retried."""


@host_error(HostExit.DEVICE)
class DeviceError(PipelineError):
    """Something went wrong while talking to a board."""


@host_error(HostExit.UNREACHABLE)
class DeviceUnreachable(DeviceError):
    """Retried: the link may come back."""


@host_error(HostExit.HOST_KEY)
class HostKeyRejected(DeviceError):
    """Never retried, never auto-accepted."""


@host_error(HostExit.INCOMPATIBLE)
class DeviceIncompatible(DeviceError):
    """Checked before a job is sent: protocol, ORT version, training API, RAM or disk."""


@host_error(HostExit.TRANSFER)
class TransferError(DeviceError):
    """Retried: blobs are content-addressed and renamed into place only when whole."""


@host_error(HostExit.REMOTE_COMMAND)
class RemoteCommandFailed(DeviceError):
    """Carries the command, its exit code and the tail of its output."""

    def __init__(self, command: list[str] | str, code: int, output: str = "") -> None:
        self.command = command
        self.code = code
        self.output = output[-2000:]
        cmd = command if isinstance(command, str) else " ".join(command)
        tail = f"\n{self.output}" if self.output else ""
        super().__init__(f"remote command failed with exit code {code}: {cmd}{tail}")


@host_error(HostExit.TRAINING_FAILED)
class TrainingFailed(DeviceError):
    """The training job ended as failed on the board; never retried."""


@host_error(HostExit.EVALUATION)
class EvaluationError(PipelineError):
    """Host-side evaluation of a model failed."""


@host_error(HostExit.REGISTRY)
class RegistryError(PipelineError):
    """The model registry (local folder or shared store) refused an operation."""


@host_error(HostExit.FLEET)
class FleetError(PipelineError):
    """Each board's cause is named."""


@host_error(HostExit.STRAGGLER)
class Straggler(FleetError):
    """Never retried: the round goes on without the board while the quorum holds."""


@host_error(HostExit.STORE)
class StoreError(PipelineError):
    """The shared store: its URL, credentials or schema (tasks/store/); the message names the variable."""


@host_error(HostExit.STORE_UNREACHABLE)
class StoreUnreachable(StoreError):
    """Retried: the server may come back; nothing is referenced before it is whole."""


def should_retry(exc: BaseException) -> bool:
    """The retry policy for host errors: another try only for an error whose class is ``retryable``."""
    return isinstance(exc, PipelineError) and exc.retryable


def agent_exit_retryable(code: int) -> bool:
    """Whether a job that ended on the board with agent exit ``code`` may run again (resuming from its
    last checkpoint): every code but ``NEVER_RETRY`` (bad spec, protocol, data, divergence)."""
    return code not in NEVER_RETRY


def ort_message(error: str) -> str:
    """ONNX Runtime's error text without its C++ source positions and signatures, on one line.

    ORT writes ``<file>.cc:<line> <C++ signature> [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION :
    <message>`` and, inside messages, ``<file>.cc:<line> <signature> <condition> was false. <why>``;
    what remains is ``<message>`` with ``<why>``, or "" when nothing readable is left.
    """
    text = " ".join(error.split())
    text = re.sub(r"\S+\.(?:cc|h|cpp):\d+ [^\[]*?\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"\S+\.(?:cc|h|cpp):\d+ .*? was false\.\s*", "", text)
    text = re.sub(r"\S+\.(?:cc|h|cpp):\d+ \S+", "", text)
    return text.strip()
