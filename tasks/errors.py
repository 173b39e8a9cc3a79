"""One error tree for the whole host side of the pipeline, its exit codes and its retry policy.

Callers catch at the level they care about::

    PipelineError                      anything the pipeline raises on purpose
    ├── RecipeError                    a recipe field is wrong (names field + expectation)
    ├── ModelError                     the model cannot be built, loaded or exported
    ├── ArtifactError                  training artifacts cannot be generated or would not load
    ├── ValidationFailed               the offline dry-run of the recipe failed a check
    ├── DataError                      a dataset is missing or has the wrong shape/dtype/labels
    ├── BoardError                     inventory / virtual board problems (unknown board, bad entry)
    ├── InvalidJob                     a job id or job spec is unsafe or conflicts (never retried)
    ├── DeviceError                    talking to a board went wrong
    │   ├── DeviceUnreachable          link down, timeout, refused (retryable)
    │   ├── HostKeyRejected            unknown or changed host key (never retried)
    │   ├── DeviceIncompatible         protocol/ORT/training API/RAM/disk mismatch
    │   ├── TransferError              upload/download failed or hash mismatch (retryable)
    │   ├── RemoteCommandFailed        a remote command exited non-zero (command, code, output)
    │   └── TrainingFailed             the job ended as failed on the board (never retried)
    ├── EvaluationError                host-side evaluation failed
    ├── RegistryError                  the model registry refused an operation
    ├── FleetError                     a fleet round lacked its quorum of boards
    │   └── Straggler                  one board missed the round's deadline (the round goes on)
    └── StackError (flows.stack)       the local Prefect stack could not start, deploy or stop

**Retry policy** (the one place that decides): :func:`should_retry` for host errors (only the
classes marked ``retryable``: link down, timeout, transfer) — used by the Prefect tasks, the blob
upload and the event follower; :func:`agent_exit_retryable` for a job that ended on the board
(every agent exit code but ``device_agent.protocol.NEVER_RETRY``) — used to decide whether a job
runs again.

**Exit codes** of ``odl`` (:class:`HostExit`), 50-79, apart from the agent's (0-49, see
``device_agent/README.md``): each error class exits with its own code.

| code | name | error | what to do |
|---|---|---|---|
| 50 | `PIPELINE` | `PipelineError` | the pipeline stopped without a more specific cause: read the message (-v shows the traceback) |
| 51 | `RECIPE` | `RecipeError` | a recipe field is wrong: fix the field the message names (in the TOML or its --set) |
| 52 | `MODEL` | `ModelError` | the model cannot be built, loaded or exported: check the recipe's model entry and its files |
| 53 | `ARTIFACT` | `ArtifactError` | training artifacts cannot be generated or would not load on the board: change the trainable parameters or the loss |
| 54 | `VALIDATION` | `ValidationFailed` | the offline dry-run failed the check it names: fix the recipe before sending it to a board |
| 55 | `DATA` | `DataError` | a dataset is missing or does not fit the model: fix its path, shape, dtype or labels |
| 56 | `BOARD` | `BoardError` | the board is not in the inventory or its entry is wrong: see odl board list and inventory.toml |
| 57 | `INVALID_JOB` | `InvalidJob` | the job id is unsafe, or the board holds another spec under it: choose another --job-id |
| 58 | `DEVICE` | `DeviceError` | talking to the board failed: read the message, then the job's agent.log on the board |
| 59 | `UNREACHABLE` | `DeviceUnreachable` | the board cannot be reached (link down, timeout, refused): check its network and sshd, run again |
| 60 | `HOST_KEY` | `HostKeyRejected` | the board's host key is unknown or changed: check the board, then update the pinned known_hosts |
| 61 | `INCOMPATIBLE` | `DeviceIncompatible` | the board cannot run this job (protocol, ORT, training API, RAM, disk): fix what the message lists |
| 62 | `TRANSFER` | `TransferError` | an upload or download failed or its hash did not match: run again (nothing half-written is used) |
| 63 | `REMOTE_COMMAND` | `RemoteCommandFailed` | a command on the board failed: the message holds its exit code and output |
| 64 | `TRAINING_FAILED` | `TrainingFailed` | the job failed or was cancelled on the board: its agent exit code is in the message (device_agent/README.md) |
| 65 | `EVALUATION` | `EvaluationError` | host-side evaluation failed: check the test set and the retrieved model |
| 66 | `REGISTRY` | `RegistryError` | the model registry refused the operation: check the recipe and board names and the registry folder |
| 67 | `STACK` | `StackError` | the local Prefect stack could not start, deploy or stop: read the logs under $ODL_HOME/logs |
| 68 | `NO_NEW_DATA` | `NoNewData` | the board's dataset folder holds nothing new to train on: let the board application add data (a flow run ends 'No new data' instead) |
| 69 | `FLEET` | `FleetError` | fewer boards than the recipe's fleet.min_boards finished a round: bring boards back (odl board status), or lower min_boards / raise deadline_s |
| 70 | `STRAGGLER` | `Straggler` | a board did not finish its part of a fleet round before fleet.deadline_s: check the board (odl board status), or raise deadline_s |

Other statuses: 0 success; 1 an error outside this tree (a bug prints its traceback; ``odl report``
finds no report); 2 a command-line usage error; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import enum
import re

from device_agent.protocol import NEVER_RETRY


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


HOST_EXIT_HELP: dict[HostExit, str] = {
    HostExit.PIPELINE: "the pipeline stopped without a more specific cause: read the message (-v shows the traceback)",
    HostExit.RECIPE: "a recipe field is wrong: fix the field the message names (in the TOML or its --set)",
    HostExit.MODEL: "the model cannot be built, loaded or exported: check the recipe's model entry and its files",
    HostExit.ARTIFACT: "training artifacts cannot be generated or would not load on the board: change the trainable parameters or the loss",
    HostExit.VALIDATION: "the offline dry-run failed the check it names: fix the recipe before sending it to a board",
    HostExit.DATA: "a dataset is missing or does not fit the model: fix its path, shape, dtype or labels",
    HostExit.BOARD: "the board is not in the inventory or its entry is wrong: see odl board list and inventory.toml",
    HostExit.INVALID_JOB: "the job id is unsafe, or the board holds another spec under it: choose another --job-id",
    HostExit.DEVICE: "talking to the board failed: read the message, then the job's agent.log on the board",
    HostExit.UNREACHABLE: "the board cannot be reached (link down, timeout, refused): check its network and sshd, run again",
    HostExit.HOST_KEY: "the board's host key is unknown or changed: check the board, then update the pinned known_hosts",
    HostExit.INCOMPATIBLE: "the board cannot run this job (protocol, ORT, training API, RAM, disk): fix what the message lists",
    HostExit.TRANSFER: "an upload or download failed or its hash did not match: run again (nothing half-written is used)",
    HostExit.REMOTE_COMMAND: "a command on the board failed: the message holds its exit code and output",
    HostExit.TRAINING_FAILED: "the job failed or was cancelled on the board: its agent exit code is in the message (device_agent/README.md)",
    HostExit.EVALUATION: "host-side evaluation failed: check the test set and the retrieved model",
    HostExit.REGISTRY: "the model registry refused the operation: check the recipe and board names and the registry folder",
    HostExit.STACK: "the local Prefect stack could not start, deploy or stop: read the logs under $ODL_HOME/logs",
    HostExit.FLEET: "fewer boards than the recipe's fleet.min_boards finished a round: bring boards back (odl board status), or lower min_boards / raise deadline_s",
    HostExit.STRAGGLER: "a board did not finish its part of a fleet round before fleet.deadline_s: check the board (odl board status), or raise deadline_s",
    HostExit.NO_NEW_DATA: "the board's dataset folder holds nothing new to train on: let the board application add data (a flow run ends 'No new data' instead)",
}


class PipelineError(Exception):
    """Base of every error the pipeline raises on purpose."""

    retryable: bool = False
    exit_code: int = HostExit.PIPELINE


class RecipeError(PipelineError):
    """A recipe field is wrong; the message names the field and what was expected."""

    exit_code = HostExit.RECIPE

    def __init__(self, field: str, expected: str, got: object = None, *, source: str = "") -> None:
        self.field = field
        self.expected = expected
        self.got = got
        where = f"{source}: " if source else ""
        got_txt = "" if got is None else f" (got {got!r})"
        super().__init__(f"{where}recipe field '{field}': expected {expected}{got_txt}")


class ModelError(PipelineError):
    """The model cannot be built, loaded or exported."""

    exit_code = HostExit.MODEL


class ArtifactError(PipelineError):
    """Training artifacts cannot be generated, or a board with ORT 1.19.2 could not load them."""

    exit_code = HostExit.ARTIFACT


class ValidationFailed(PipelineError):
    """The offline dry-run of a recipe failed one of its checks."""

    exit_code = HostExit.VALIDATION

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        super().__init__(f"validation check '{check}' failed: {message}")


class DataError(PipelineError):
    """A dataset is missing or does not match the model (shape, dtype, label range, NaN)."""

    exit_code = HostExit.DATA


class NoNewData(DataError):
    """The board's dataset folder holds nothing to retrain on (no file, or none new): a nightly
    run ends as "No new data" rather than failing."""

    exit_code = HostExit.NO_NEW_DATA


class BoardError(PipelineError):
    """An inventory entry or the virtual board is wrong or unusable."""

    exit_code = HostExit.BOARD


class InvalidJob(PipelineError):
    """A job id or job spec is unsafe or conflicts with the job already on the board; never retried."""

    exit_code = HostExit.INVALID_JOB


class DeviceError(PipelineError):
    """Something went wrong while talking to a board."""

    exit_code = HostExit.DEVICE


class DeviceUnreachable(DeviceError):
    """The board cannot be reached now (link down, timeout, connection refused)."""

    retryable = True
    exit_code = HostExit.UNREACHABLE


class HostKeyRejected(DeviceError):
    """The board's host key is unknown or changed: never retried, never auto-accepted."""

    exit_code = HostExit.HOST_KEY


class DeviceIncompatible(DeviceError):
    """The board cannot run this job (protocol, ORT version, training API, RAM or disk)."""

    exit_code = HostExit.INCOMPATIBLE


class TransferError(DeviceError):
    """An upload or download failed or its hash did not match."""

    retryable = True
    exit_code = HostExit.TRANSFER


class RemoteCommandFailed(DeviceError):
    """A remote command exited non-zero; carries the command, exit code and output tail."""

    exit_code = HostExit.REMOTE_COMMAND

    def __init__(self, command: list[str] | str, code: int, output: str = "") -> None:
        self.command = command
        self.code = code
        self.output = output[-2000:]
        cmd = command if isinstance(command, str) else " ".join(command)
        tail = f"\n{self.output}" if self.output else ""
        super().__init__(f"remote command failed with exit code {code}: {cmd}{tail}")


class TrainingFailed(DeviceError):
    """The training job ended as failed on the board."""

    exit_code = HostExit.TRAINING_FAILED


class EvaluationError(PipelineError):
    """Host-side evaluation of a model failed."""

    exit_code = HostExit.EVALUATION


class RegistryError(PipelineError):
    """The local model registry refused an operation."""

    exit_code = HostExit.REGISTRY


class FleetError(PipelineError):
    """A fleet round could not go on: fewer boards than its quorum finished (each board's cause named)."""

    exit_code = HostExit.FLEET


class Straggler(FleetError):
    """A board did not finish its part of a round before the round's deadline (never retried: the
    round goes on without it while the quorum holds)."""

    exit_code = HostExit.STRAGGLER


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
