"""One error tree for the whole host side of the pipeline.

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
    └── RegistryError                  the model registry refused an operation

Only errors whose ``retryable`` attribute is true are retried by the Prefect tasks.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error the pipeline raises on purpose."""

    retryable: bool = False
    exit_code: int = 1


class RecipeError(PipelineError):
    """A recipe field is wrong; the message names the field and what was expected."""

    exit_code = 2

    def __init__(self, field: str, expected: str, got: object = None, *, source: str = "") -> None:
        self.field = field
        self.expected = expected
        self.got = got
        where = f"{source}: " if source else ""
        got_txt = "" if got is None else f" (got {got!r})"
        super().__init__(f"{where}recipe field '{field}': expected {expected}{got_txt}")


class ModelError(PipelineError):
    """The model cannot be built, loaded or exported."""

    exit_code = 3


class ArtifactError(PipelineError):
    """Training artifacts cannot be generated, or a board with ORT 1.19.2 could not load them."""

    exit_code = 4


class ValidationFailed(PipelineError):
    """The offline dry-run of a recipe failed one of its checks."""

    exit_code = 5

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        super().__init__(f"validation check '{check}' failed: {message}")


class DataError(PipelineError):
    """A dataset is missing or does not match the model (shape, dtype, label range, NaN)."""

    exit_code = 6


class BoardError(PipelineError):
    """An inventory entry or the virtual board is wrong or unusable."""

    exit_code = 7


class InvalidJob(PipelineError):
    """A job id or job spec is unsafe or conflicts with the job already on the board; never retried."""

    exit_code = 17


class DeviceError(PipelineError):
    """Something went wrong while talking to a board."""

    exit_code = 8


class DeviceUnreachable(DeviceError):
    """The board cannot be reached now (link down, timeout, connection refused)."""

    retryable = True
    exit_code = 9


class HostKeyRejected(DeviceError):
    """The board's host key is unknown or changed: never retried, never auto-accepted."""

    exit_code = 10


class DeviceIncompatible(DeviceError):
    """The board cannot run this job (protocol, ORT version, training API, RAM or disk)."""

    exit_code = 11


class TransferError(DeviceError):
    """An upload or download failed or its hash did not match."""

    retryable = True
    exit_code = 12


class RemoteCommandFailed(DeviceError):
    """A remote command exited non-zero; carries the command, exit code and output tail."""

    exit_code = 13

    def __init__(self, command: list[str] | str, code: int, output: str = "") -> None:
        self.command = command
        self.code = code
        self.output = output[-2000:]
        cmd = command if isinstance(command, str) else " ".join(command)
        tail = f"\n{self.output}" if self.output else ""
        super().__init__(f"remote command failed with exit code {code}: {cmd}{tail}")


class TrainingFailed(DeviceError):
    """The training job ended as failed on the board."""

    exit_code = 14


class EvaluationError(PipelineError):
    """Host-side evaluation of a model failed."""

    exit_code = 15


class RegistryError(PipelineError):
    """The local model registry refused an operation."""

    exit_code = 16
