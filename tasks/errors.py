"""One error tree for the whole host side of the pipeline, its exit codes and its retry policy.

Each error's exit code, help (cause: what to do) and retry flag are written once, in
:data:`HOST_EXITS`; the tree and the table below, :data:`HOST_EXIT_HELP`, each class's ``exit_code``,
``retryable`` and the first line of its docstring (:func:`host_error`) are rendered from it, and
``tests/test_errors.py`` holds the README's table equal to it. Callers catch at the level they care
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
finds no report); 2 a command-line usage error; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from device_agent.protocol import NEVER_RETRY

E = TypeVar("E", bound=type)


@enum.unique
class HostExit(enum.IntEnum):
    """Exit codes of the host's ``odl`` command, one per error class (50-79; the agent's are 0-49)."""

    PIPELINE = 50
    RECIPE = 51
    MODEL = 52
    ARTIFACT = 53
    VALIDATION = 54
    DATA = 55
    BOARD = 56
    INVALID_JOB = 57
    DEVICE = 58
    UNREACHABLE = 59
    HOST_KEY = 60
    INCOMPATIBLE = 61
    TRANSFER = 62
    REMOTE_COMMAND = 63
    TRAINING_FAILED = 64
    EVALUATION = 65
    REGISTRY = 66
    STACK = 67
    NO_NEW_DATA = 68
    FLEET = 69
    STRAGGLER = 70


@dataclass(frozen=True)
class HostExitInfo:
    """One exit code: its error class (by name, under ``parent``), its help and retry flag."""

    code: HostExit
    error: str  # the class raising it
    parent: str  # the class it derives from ("" for the root)
    help: str  # "cause: what to do"
    retryable: bool = False  # should_retry() tries again
    home: str = ""  # the module defining the class, when not this one

    @property
    def cause(self) -> str:
        """The help's part before its first colon: what went wrong."""
        return self.help.split(": ", 1)[0]


HOST_EXITS: tuple[HostExitInfo, ...] = (
    HostExitInfo(HostExit.PIPELINE, "PipelineError", "",
                 "the pipeline stopped without a more specific cause: read the message (-v shows the traceback)"),
    HostExitInfo(HostExit.RECIPE, "RecipeError", "PipelineError",
                 "a recipe field is wrong: fix the field the message names (in the TOML or its --set)"),
    HostExitInfo(HostExit.MODEL, "ModelError", "PipelineError",
                 "the model cannot be built, loaded or exported: check the recipe's model entry and its files"),
    HostExitInfo(HostExit.ARTIFACT, "ArtifactError", "PipelineError",
                 "training artifacts cannot be generated or would not load on the board: change the trainable "
                 "parameters or the loss"),
    HostExitInfo(HostExit.VALIDATION, "ValidationFailed", "PipelineError",
                 "the offline dry-run failed the check it names: fix the recipe before sending it to a board"),
    HostExitInfo(HostExit.DATA, "DataError", "PipelineError",
                 "a dataset is missing or does not fit the model: fix its path, shape, dtype or labels"),
    HostExitInfo(HostExit.BOARD, "BoardError", "PipelineError",
                 "the board is not in the inventory or its entry is wrong: see odl board list and inventory.toml"),
    HostExitInfo(HostExit.INVALID_JOB, "InvalidJob", "PipelineError",
                 "the job id is unsafe, or the board holds another spec under it: choose another --job-id"),
    HostExitInfo(HostExit.DEVICE, "DeviceError", "PipelineError",
                 "talking to the board failed: read the message, then the job's agent.log on the board"),
    HostExitInfo(HostExit.UNREACHABLE, "DeviceUnreachable", "DeviceError",
                 "the board cannot be reached (link down, timeout, refused): check its network and sshd, run again",
                 retryable=True),
    HostExitInfo(HostExit.HOST_KEY, "HostKeyRejected", "DeviceError",
                 "the board's host key is unknown or changed: check the board, then update the pinned known_hosts"),
    HostExitInfo(HostExit.INCOMPATIBLE, "DeviceIncompatible", "DeviceError",
                 "the board cannot run this job (protocol, ORT, training API, RAM, disk): fix what the message "
                 "lists"),
    HostExitInfo(HostExit.TRANSFER, "TransferError", "DeviceError",
                 "an upload or download failed or its hash did not match: run again (nothing half-written is used)",
                 retryable=True),
    HostExitInfo(HostExit.REMOTE_COMMAND, "RemoteCommandFailed", "DeviceError",
                 "a command on the board failed: the message holds its exit code and output"),
    HostExitInfo(HostExit.TRAINING_FAILED, "TrainingFailed", "DeviceError",
                 "the job failed or was cancelled on the board: its agent exit code is in the message "
                 "(device_agent/README.md)"),
    HostExitInfo(HostExit.EVALUATION, "EvaluationError", "PipelineError",
                 "host-side evaluation failed: check the test set and the retrieved model"),
    HostExitInfo(HostExit.REGISTRY, "RegistryError", "PipelineError",
                 "the model registry refused the operation: check the recipe and board names and the registry "
                 "folder"),
    HostExitInfo(HostExit.STACK, "StackError", "PipelineError",
                 "the local Prefect stack could not start, deploy or stop: read the logs under $ODL_HOME/logs",
                 home="tasks.stack"),
    HostExitInfo(HostExit.NO_NEW_DATA, "NoNewData", "DataError",
                 "the board's dataset folder holds nothing new to train on: let the board application add data "
                 "(a flow run ends 'No new data' instead)"),
    HostExitInfo(HostExit.FLEET, "FleetError", "PipelineError",
                 "fewer boards than the recipe's fleet.min_boards finished a round: bring boards back (odl board "
                 "status), or lower min_boards / raise deadline_s"),
    HostExitInfo(HostExit.STRAGGLER, "Straggler", "FleetError",
                 "a board did not finish its part of a fleet round before fleet.deadline_s: check the board (odl "
                 "board status), or raise deadline_s"),
)  # fmt: skip
HOST_EXIT_HELP: dict[HostExit, str] = {info.code: info.help for info in HOST_EXITS}
_INFO: dict[HostExit, HostExitInfo] = {info.code: info for info in HOST_EXITS}


def exit_table() -> str:
    """The exit codes as a Markdown table (the module docstring's and the README's)."""
    rows = [f"| {int(i.code)} | `{i.code.name}` | `{i.error}` | {i.help} |" for i in HOST_EXITS]
    return "\n".join(["| code | name | error | what to do |", "|---|---|---|---|", *rows])


def error_tree() -> str:
    """The error classes as a tree, each with its cause (and whether it is retried)."""
    lines: list[str] = []

    def walk(info: HostExitInfo, prefix: str, branch: str) -> None:
        name = f"{info.error} ({info.home})" if info.home else info.error
        note = f"{info.cause} (retryable)" if info.retryable else info.cause
        lines.append(f"    {prefix}{branch}{name}".ljust(39) + note)
        children = [c for c in HOST_EXITS if c.parent == info.error]
        inner = prefix + ("" if not branch else "    " if branch == "└── " else "│   ")
        for i, child in enumerate(children):
            walk(child, inner, "└── " if i == len(children) - 1 else "├── ")

    walk(HOST_EXITS[0], "", "")
    return "\n".join(lines)


__doc__ = (__doc__ or "").replace("{tree}", error_tree()).replace("{table}", exit_table())


def host_error(code: HostExit) -> Callable[[E], E]:
    """Give an error class its exit ``code``, retry flag and, as its docstring's first line, the
    cause, all from :data:`HOST_EXITS` (whose entry must name the class)."""

    def mark(cls: E) -> E:
        info = _INFO[code]
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
    """The local model registry refused an operation."""


@host_error(HostExit.FLEET)
class FleetError(PipelineError):
    """Each board's cause is named."""


@host_error(HostExit.STRAGGLER)
class Straggler(FleetError):
    """Never retried: the round goes on without the board while the quorum holds."""


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
