"""One job on a board from start to end: install the agent, upload the blobs, create, start and
follow the job; idempotent on the job id (a job already on the board is reattached, not redone)."""

from __future__ import annotations

import logging
import posixpath
from pathlib import Path

from device_agent.protocol import JobResult, JobSpec
from tasks.board.agent import install_agent
from tasks.board.blobs import UploadReport, upload_blobs
from tasks.board.follow import EventCallback, FollowStats, follow_job
from tasks.board.inventory import Board
from tasks.board.jobs import create_job, job_dir, read_result, resumable, start_job
from tasks.board.orphans import settle_orphan
from tasks.board.transport import ByteProgress, Transport

log = logging.getLogger(__name__)


def drive_job(
    conn: Transport,
    board: Board,
    spec: JobSpec,
    files: dict[str, Path],
    on_event: EventCallback | None = None,
    progress: ByteProgress | None = None,
    *,
    deployed: bool = False,
    end_orphans: bool = False,
    deadline: float | None = None,
    stats: FollowStats | None = None,
) -> tuple[UploadReport, JobResult]:
    """Install + upload + create + start + follow; reattaches when the job id is already on the board.

    A job that ended is returned as it is; one that runs is followed; one that was interrupted
    is resumed by the agent (from its last checkpoint). Nothing is uploaded again in those cases.
    ``deployed=True`` says the caller has just run install_agent and upload_blobs for ``files``
    (the flow's deploy stage): their checks are not repeated (the agent itself still verifies
    every blob's sha256 before training).

    One job trains on a board at a time: when another is training, a job made from the same
    inputs (its run was killed) is followed instead of this one; any other is cancelled first
    when ``end_orphans`` (the caller holds the board's concurrency slot), else BoardError.
    ``deadline`` (monotonic) and ``stats`` are passed to :func:`follow_job` (a fleet round's
    deadline; the reconnects and resumes it took).
    """
    jdir = job_dir(board, spec.job_id)
    if not deployed:
        install_agent(conn, board, spec.memory_estimate_mb, spec.runtime)
    report = UploadReport()
    if conn.exists(posixpath.join(jdir, "job.json")):
        log.info("job %s already on board %s: reattaching", spec.job_id, board.name)
    else:
        adopted = settle_orphan(conn, board, spec, end=end_orphans)
        if adopted != spec.job_id:  # the same training, started by a run that was killed
            return report, follow_job(conn, board, adopted, 0, on_event, deadline=deadline, stats=stats)
        if not deployed:
            report = upload_blobs(conn, board, files, progress)
        create_job(conn, board, spec)
    if resumable(read_result(conn, board, spec.job_id)):
        log.info("job %s %s on board %s", spec.job_id, start_job(conn, board, spec.job_id), board.name)
    return report, follow_job(conn, board, spec.job_id, 0, on_event, deadline=deadline, stats=stats)
