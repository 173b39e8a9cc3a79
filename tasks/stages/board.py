"""Board stages: deploy (agent + blobs), train (run or reattach, follow events), retrieve.

Each takes the board's inventory entry and opens its own link through the job contract's seam
(:func:`tasks.board.joblink.job_link`: ``ssh``, ``local`` or ``pull``, from the entry), unless the
caller passes an open transport to share.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device_agent.protocol import Event, JobResult, JobSpec
from tasks.board.follow import FollowStats
from tasks.board.inventory import Board
from tasks.board.joblink import job_link
from tasks.board.jobs import job_dir
from tasks.board.transport import ByteProgress, Transport
from tasks.errors import TransferError
from tasks.prepare.prefix import stitch

log = logging.getLogger(__name__)

EventCallback = Callable[[Event], None]


@dataclass(frozen=True)
class Deployment:
    """What deploying a job's files did: the agent's answer and the blobs sent or already there."""

    board: str
    info: Any  # the agent's typed ``info`` answer
    uploaded: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    bytes_sent: int = 0


@dataclass(frozen=True)
class Training:
    """A job that ended on the board: its result and every event it wrote, in order."""

    board: str
    job_id: str
    result: JobResult
    events: tuple[Event, ...] = ()
    prefix_model: Path | None = None  # frozen-prefix caching: the board trained the suffix only
    reconnects: int = 0  # new connections the host needed while following the job (dropped links)


@dataclass(frozen=True)
class Retrieved:
    """The job's outputs on the host, each verified against ``result.json``."""

    job_id: str
    out_dir: Path
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def inference(self) -> Path:
        """The trained inference model."""
        if "inference" not in self.files:
            raise TransferError(
                f"job {self.job_id}: result.json lists no 'inference' output (has {sorted(self.files)})"
            )
        return self.files["inference"]


def deploy(
    board: Board,
    spec: JobSpec,
    files: dict[str, Path],
    *,
    progress: ByteProgress | None = None,
    conn: Transport | None = None,
    outputs: tuple[str, ...] | None = None,
) -> Deployment:
    """Install/check the agent (refusing a board that cannot run ``spec``), upload missing blobs;
    ``outputs``: the only outputs the run will fetch (a pull-mode board then sends back only these:
    a fleet round's trained tensors, not its inference model)."""
    with job_link(board, conn, outputs) as link:
        done = link.deliver(spec, files, progress)
    return Deployment(board.name, done.info, tuple(done.uploaded), tuple(done.skipped), done.bytes_sent)


def train(
    board: Board,
    spec: JobSpec,
    files: dict[str, Path],
    *,
    on_event: EventCallback | None = None,
    conn: Transport | None = None,
    end_orphans: bool = False,
    deadline: float | None = None,
) -> Training:
    """Create, start and follow the job on a deployed board; reattaches when it already exists.

    A finished job returns its result; a running one is followed; an interrupted one resumes from
    its last checkpoint. Raises TrainingFailed when the job fails or is cancelled. Another job
    training on the board is reattached when made from the same inputs (its run was killed: the
    Training then names that job), else ended when ``end_orphans``, else refused (BoardError).
    Past ``deadline`` (a ``time.monotonic()`` instant) it raises Straggler.
    """
    job_dir(board, spec.job_id)  # an unsafe job id is refused before anything connects
    events: list[Event] = []

    def record(event: Event) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event)

    stats = FollowStats()
    with job_link(board, conn) as link:
        result = link.run(spec, files, record, end_orphans=end_orphans, deadline=deadline, stats=stats)
    # the prefix retrieval joins to the board's suffix (the autograd runtime's board writes the whole model)
    prefix = (
        files.get(spec.prefix.model.sha256)
        if spec.prefix is not None and spec.runtime != "autograd"
        else None
    )
    return Training(board.name, result.job_id, result, tuple(events), prefix, stats.reconnects)


def retrieve(
    board: Board,
    training: Training,
    out_dir: Path,
    *,
    progress: ByteProgress | None = None,
    conn: Transport | None = None,
    only: tuple[str, ...] | None = None,
) -> Retrieved:
    """Download the job's outputs into ``out_dir`` (or the ``only`` ones), each checked against its
    sha256. When the board trained the suffix of a split model, its inference model is joined to
    the prefix here: ``inference`` is the whole model, ``inference_suffix`` what the board wrote."""
    with job_link(board, conn) as link:
        files = link.fetch(training.job_id, training.result, Path(out_dir), progress, only)
    if training.prefix_model is not None and "inference" in files:
        suffix = files["inference"].replace(files["inference"].with_name("inference_suffix.onnx"))
        files["inference_suffix"] = suffix
        files["inference"] = stitch(training.prefix_model, suffix, Path(out_dir) / "inference.onnx")
    return Retrieved(training.job_id, Path(out_dir), files)
