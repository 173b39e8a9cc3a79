"""The host's exit codes (``odl``, 50-79; the agent's are 0-49): each code's error class, its place
in the error tree, its help (cause: what to do) and whether it is retried, written once in
:data:`HOST_EXITS`. ``tasks/errors.py`` builds its classes, docstring and table from it.

A stop signal (:data:`STOP_SIGNALS`: SIGINT, SIGTERM, SIGHUP) ends ``odl`` the way Ctrl-C does:
:class:`Interrupted` unwinds every cleanup, one line is printed and the status is 128 + the
signal's number (:func:`interrupted_exit`: 130, 143, 129), as a shell reports the signal.
``odl`` and preparation's children end without the collector's passes over what they still hold
(:func:`no_collection_at_exit`)."""

from __future__ import annotations

import atexit
import contextlib
import enum
import gc
import io
import signal
from dataclasses import dataclass


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
    STORE = 71
    STORE_UNREACHABLE = 72


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
                 "the job failed or was cancelled on the board, or kept stopping: the message holds its agent "
                 "exit code (device_agent/README.md), or says why it has none"),
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
    HostExitInfo(HostExit.STORE, "StoreError", "PipelineError",
                 "the shared store (ODL_STORE_URL) refused this host or its configuration: fix the variable the "
                 "message names (URL without a password, ODL_STORE_PASSWORD_FILE or ~/.pgpass)"),
    HostExitInfo(HostExit.STORE_UNREACHABLE, "StoreUnreachable", "StoreError",
                 "the shared store (ODL_STORE_URL) cannot be reached: check the server and the network, run "
                 "again (nothing half-written is used)", retryable=True),
)  # fmt: skip
HOST_EXIT_HELP: dict[HostExit, str] = {info.code: info.help for info in HOST_EXITS}
EXIT_INFO: dict[HostExit, HostExitInfo] = {info.code: info for info in HOST_EXITS}


def exit_table() -> str:
    """The exit codes as a Markdown table (the module docstring's and the manual's docs/reference/exit-codes.md)."""
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


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupted_exit(signum: int) -> int:
    """``odl``'s exit status when stopped by ``signum``: 128 + its number (130 for Ctrl-C)."""
    return 128 + int(signum)


class Interrupted(KeyboardInterrupt):
    """A stop signal, raised like Ctrl-C's KeyboardInterrupt so every cleanup runs; ``signum``."""

    def __init__(self, signum: int) -> None:
        self.signum = signal.Signals(signum)
        super().__init__(self.signum.name)


_QUICK_EXIT: list[bool] = []


def no_collection_at_exit() -> None:
    """Let the interpreter's finalisation skip its garbage-collector passes over what this process
    still holds (:func:`_frozen`, at exit, after every atexit handler registered later has run).

    With torch, sympy and onnx loaded a process holds 0.24-0.52 M objects that the collector tracks;
    finalisation walks them in several full passes (0.4 s each on a quiet 2-core machine, more
    under load), which py-spy showed as nearly all the time ``odl prepare`` (1.4 s) and its
    ``child_call`` child (0.7-1.3 s, which ``odl`` waits for) spent after the last line printed.
    Frozen, the objects still go as finalisation clears the modules (reference counting); only
    reference cycles among them are left to the operating system, which takes the memory and the
    descriptors back. Registered once per process."""
    if not _QUICK_EXIT:
        _QUICK_EXIT.append(True)
        atexit.register(_frozen)


def _frozen() -> None:
    """:func:`gc.freeze`, after flushing every open file written to: a file object left in a
    reference cycle is never finalised once frozen, and its buffered bytes would be lost. The other
    cleanups that reach outside the process do not wait for the collector: temporary folders are
    ``weakref.finalize``'s, which runs them at exit, children are stopped by atexit handlers, log
    handlers flushed by :func:`logging.shutdown`, descriptors closed by the operating system."""
    for obj in gc.get_objects():
        # the type's, not isinstance: that reads obj.__class__, which warns for torch's deprecated names
        if issubclass(type(obj), io.IOBase):
            with contextlib.suppress(Exception):  # closed, detached or not writable: nothing to flush
                if not obj.closed and obj.writable():
                    obj.flush()
    gc.freeze()
