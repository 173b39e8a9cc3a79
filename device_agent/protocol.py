"""The contract between host and board: versions, exit codes, the board's layout and wire types.

Imported by the device agent *and* by the host, so it uses only the standard library. This module
is the one way in: ``from device_agent.protocol import X`` for every name below. It holds the
agent's version, the exit codes and the board's paths; the rest lives in sibling modules below
it and is re-exported here:

* :mod:`device_agent.wire` — what every wire type is built from: ``PROTOCOL_VERSION``,
  ``SpecError``, the field checks (``get_field``, ``check_version``...) and ``BlobRef``;
* :mod:`device_agent.names` — the one rule for names (``NAME``: job ids, board, recipe, dataset
  and report names), its refusal line (``BadName``) and ``valid_job_id``;
* :mod:`device_agent.jobspec` — what the host sends: ``JobSpec`` (``job.json``) with its
  ``DataRef`` and ``TrainParams`` (and :mod:`device_agent.prefix_spec`'s ``PrefixSpec``,
  :mod:`device_agent.keypoints_spec`'s ``KeypointsScoring``);
* :mod:`device_agent.messages` — what the agent answers: ``Event`` (``events.jsonl``),
  ``JobResult``/``FileRef`` (``result.json``), ``BoardInfo`` (``info``), ``BlobListing``
  (``blobs``).

Wire types are small frozen dataclasses with pure ``to_dict``/``from_dict`` functions that validate
every field and name the bad one in a :class:`SpecError`. Every wire object carries the protocol
version under one key, ``protocol_version`` (protocol 1 spelled it ``protocol`` and ``v``).

Board layout under the agent root (e.g. ``~/odl``)::

    blobs/<sha256>            content-addressed artifacts and data (uploaded once, read-only)
    blobs/.tmp-<sha256>-<hex> an upload in progress (``put-blob`` verifies and renames it)
    jobs/<job_id>/job.json    the JobSpec
    jobs/<job_id>/events.jsonl, result.json, inference.onnx, agent.log, checkpoints/
    training.lock, training.owner  flock held by the one job training now, and its job id
    models/<recipe>/          the models in service: releases/<version>/, current, previous,
                              current.onnx (see device_agent/README.md)
    cache/datasets/           sha256 of the files of board dataset folders, by size and mtime
    agent/device_agent/       the installed agent

Job files refer to blobs by sha256 only; the agent resolves ``blobs/<sha256>`` itself.
"""

from __future__ import annotations

import enum
import hashlib
import re

from device_agent.jobspec import (
    ARTIFACT_KEYS,
    RUNTIME_ARTIFACTS,
    TASKS,
    DataFile,
    DataRef,
    JobSpec,
    TrainParams,
)
from device_agent.keypoints_spec import KeypointsScoring
from device_agent.messages import BlobListing, BoardInfo, Event, FileRef, JobResult
from device_agent.names import (
    BOARD_PATH_ALLOWED,
    NAME,
    NAME_PATTERN,
    BadName,
    NameRule,
    board_path_ok,
    check_board_path,
    valid_job_id,
)
from device_agent.prefix_spec import PrefixSpec
from device_agent.teacher_spec import TeacherSpec
from device_agent.wire import (
    PROTOCOL_VERSION,
    SHA256_RE,
    V1_VERSION_KEYS,
    VERSION_KEY,
    BlobRef,
    SpecError,
    check_version,
    get_field,
    parse_json,
    read_version,
    reject_unknown,
    typed_fields,
    valid_blob_name,
)

AGENT_VERSION = "0.5.0"
BLOBS_DIR = "blobs"
BLOB_TMP_PREFIX = ".tmp-"
BLOB_TMP_RE = re.compile(r"^\.tmp-[0-9a-f]{64}-[0-9a-f]{8,32}$")
STALE_TMP_S = 600  # an upload untouched this long was cut off: ``blobs`` removes it
EVENT_TYPES = ("started", "labels", "step", "epoch", "eval", "checkpoint", "cache", "finished", "failed",
               "cancelled")  # fmt: skip


@enum.unique
class ExitCode(enum.IntEnum):
    """Agent exit codes, grouped by cause. 1x: the request is wrong; 2x: artifact/runtime; 3x: environment.

    The host's own exit codes (``tasks.errors.HostExit``) are 50-79, apart from these.
    """

    OK = 0
    INVALID_SPEC = 10  # job.json malformed or a field is wrong
    PROTOCOL_MISMATCH = 11  # job written for another protocol version
    DATA_MISMATCH = 12  # dataset shape/dtype/labels do not fit the model
    JOB_NOT_FOUND = 13  # no such job directory / job.json
    CANCELLED = 14  # the job was cancelled (checkpoint saved)
    INVALID_ARGUMENT = 15  # a command argument is malformed or unsafe (blob name, path outside blobs/)
    ARTIFACT_INVALID = 20  # blob missing or sha256 mismatch, model does not load
    RUNTIME_ERROR = 21  # ONNX Runtime failed during training
    DIVERGED = 22  # loss became NaN/inf
    BLOB_MISMATCH = 23  # an uploaded blob's sha256 differs from its name (removed)
    CRASHED = 24  # the training process died of a signal (its step and batch named); resumed once
    CRASHED_AGAIN = 25  # ... at the same step as its previous death: deterministic, never retried
    ENVIRONMENT = 30  # generic environment problem
    NO_MEMORY = 31  # free RAM below the job's estimate
    NO_DISK = 32  # not enough free disk under the root
    NO_TRAINING_API = 33  # onnxruntime without the training API
    BUSY = 34  # the job is already running in another process
    BOARD_BUSY = 35  # another job is training on this board (one at a time)
    OUT_OF_MEMORY = 36  # the kernel killed the job for memory (its peak exceeded the RAM it may use)
    UNTRUSTED = 37  # pull mode: the endpoint refused the board's key, or its certificate is not pinned


EXIT_HELP: dict[int, str] = {
    ExitCode.OK: "success",
    ExitCode.INVALID_SPEC: "invalid job spec: fix job.json; never retried",
    ExitCode.PROTOCOL_MISMATCH: "job written for another protocol version: upgrade host or agent",
    ExitCode.DATA_MISMATCH: "dataset does not fit the model (shape, dtype, label range, NaN)",
    ExitCode.JOB_NOT_FOUND: "no job directory or job.json at the given path",
    ExitCode.CANCELLED: "job cancelled on request; its last checkpoint is kept",
    ExitCode.INVALID_ARGUMENT: "a command argument is malformed or unsafe (blob name, path outside blobs/)",
    ExitCode.ARTIFACT_INVALID: "an artifact or data blob is missing, corrupt or unloadable",
    ExitCode.RUNTIME_ERROR: "ONNX Runtime failed while training",
    ExitCode.DIVERGED: "loss became NaN or infinite; last good checkpoint kept",
    ExitCode.BLOB_MISMATCH: "an uploaded blob's sha256 differs from its name; removed: upload it again",
    ExitCode.CRASHED: "the training process died of a signal (ONNX Runtime crashed, or it was killed); the "
    "message names the signal, the step and the batch's samples; it resumes from its last checkpoint",
    ExitCode.CRASHED_AGAIN: "the training process died of the same signal at the same step as the time "
    "before: that batch kills it every time; never retried: check those samples against the loss",
    ExitCode.ENVIRONMENT: "the board's environment cannot run the job",
    ExitCode.NO_MEMORY: "free RAM is below the job's memory estimate",
    ExitCode.NO_DISK: "free disk under the agent root is too low",
    ExitCode.NO_TRAINING_API: "onnxruntime on this board has no training API",
    ExitCode.BUSY: "the job is already running",
    ExitCode.BOARD_BUSY: "another job is training on this board: wait for it, or cancel it",
    ExitCode.OUT_OF_MEMORY: "the kernel killed the job for memory; last checkpoint kept; never retried as is",
    ExitCode.UNTRUSTED: "pull mode: the endpoint refused the board's key (unknown, revoked, not accepted yet) or "
    "presented a certificate other than the pinned one; the service stops: enrol the board again",
}

# Causes that running again cannot fix: a job that failed so keeps its result (the agent's
# ``run``/``start``), and the host never restarts it (``tasks.errors.agent_exit_retryable``).
NEVER_RETRY = frozenset(
    {
        ExitCode.INVALID_SPEC,
        ExitCode.PROTOCOL_MISMATCH,
        ExitCode.DATA_MISMATCH,
        ExitCode.INVALID_ARGUMENT,
        ExitCode.DIVERGED,
        ExitCode.CRASHED_AGAIN,
        ExitCode.OUT_OF_MEMORY,
    }
)


def file_sha256(path: object, chunk: int = 1 << 20) -> str:
    """Lowercase hex sha256 of a file read in chunks (``path``: str or os.PathLike)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:  # type: ignore[arg-type]
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def blob_tmp_name(sha256: str, nonce: str) -> str:
    """The name an upload of ``sha256`` is written under in ``blobs/`` before ``put-blob``."""
    name = f"{BLOB_TMP_PREFIX}{valid_blob_name(sha256)}-{nonce}"
    if not BLOB_TMP_RE.match(name):
        raise SpecError("nonce", "8-32 lowercase hex digits", nonce)
    return name


__all__ = [
    "AGENT_VERSION", "ARTIFACT_KEYS", "RUNTIME_ARTIFACTS", "BOARD_PATH_ALLOWED", "BLOBS_DIR", "BLOB_TMP_PREFIX", "BLOB_TMP_RE", "EVENT_TYPES",
    "EXIT_HELP", "NAME", "NAME_PATTERN", "NEVER_RETRY", "PROTOCOL_VERSION", "SHA256_RE", "STALE_TMP_S", "TASKS",
    "V1_VERSION_KEYS", "VERSION_KEY", "BadName", "BlobListing", "BlobRef", "BoardInfo", "DataFile", "DataRef", "Event",
    "ExitCode", "FileRef", "JobResult", "JobSpec", "KeypointsScoring", "NameRule", "PrefixSpec", "SpecError", "TeacherSpec", "TrainParams", "blob_tmp_name",
    "board_path_ok", "check_board_path", "check_version", "file_sha256", "get_field", "parse_json", "read_version", "reject_unknown", "typed_fields",
    "valid_blob_name", "valid_job_id",
]  # fmt: skip
