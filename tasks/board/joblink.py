"""The job contract's seam: what the stages need from a board, whatever its transport.

A stage deploys a job's files, runs the job and follows its events, fetches its outputs and may
stop it; it never runs a command itself. :func:`job_link` gives the link the board's inventory
entry asks for:

- ``ssh`` and ``local``: :class:`CommandLink`, the host driving the agent over a
  :class:`~tasks.board.transport.Transport` (install the agent, upload blobs, ``start``, read
  ``events.jsonl`` from an offset, download ``result.json``'s outputs);
- ``pull``: :class:`~tasks.board.pull.link.PullLink`, a board that dials out: the job and its blobs
  wait in the host's mailbox until the board checks in, its events and outputs arrive there.

Both keep the same contract (``job.json``, blobs and outputs by sha256, events from an offset, one
job per board, a result applied once), so a stage, a flow or the registry never asks which one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from device_agent.protocol import Event, JobResult, JobSpec
from tasks.board.agent import install_agent
from tasks.board.blobs import Delivered, upload_blobs
from tasks.board.control import agent_json, list_dataset
from tasks.board.inventory import Board
from tasks.board.jobs import job_dir
from tasks.board.orphans import running_job
from tasks.board.pull.link import PullLink
from tasks.board.releases import install_version
from tasks.board.retrieve import retrieve
from tasks.board.run import drive_job
from tasks.board.transport import ByteProgress, Transport, connection

EventCallback = Callable[[Event], None]


class JobLink(Protocol):
    """A job's way to and from one board."""

    def deliver(self, spec: JobSpec, files: dict[str, Path], progress: ByteProgress | None) -> Delivered: ...
    def run(self, spec: JobSpec, files: dict[str, Path], on_event: EventCallback, *, end_orphans: bool,
            deadline: float | None, stats: Any) -> JobResult: ...  # fmt: skip
    def fetch(self, job_id: str, result: JobResult, out_dir: Path, progress: ByteProgress | None,
              only: tuple[str, ...] | None) -> dict[str, Path]: ...  # fmt: skip
    def install(self, recipe: str, version: Any) -> dict[str, Any]: ...
    def list_dataset(self, path: str, fmt: str) -> dict[str, Any]: ...
    def running_job(self) -> str | None: ...
    def cancel(self, job_id: str) -> None: ...


class CommandLink:
    """The job contract over a transport that runs the agent's commands (``ssh``, ``local``)."""

    def __init__(self, board: Board, conn: Transport) -> None:
        self.board, self.conn = board, conn

    def deliver(self, spec: JobSpec, files: dict[str, Path], progress: ByteProgress | None) -> Delivered:
        """Install/check the agent (refusing a board that cannot run ``spec``), upload missing blobs."""
        info = install_agent(self.conn, self.board, spec.memory_estimate_mb, spec.runtime)
        report = upload_blobs(self.conn, self.board, files, progress)
        return Delivered(info, report.uploaded, report.skipped, report.bytes_sent)

    def run(self, spec: JobSpec, files: dict[str, Path], on_event: EventCallback, *, end_orphans: bool,
            deadline: float | None, stats: Any) -> JobResult:  # fmt: skip
        """Create, start (or reattach to) and follow the job (:func:`tasks.board.run.drive_job`)."""
        _, result = drive_job(self.conn, self.board, spec, files, on_event, deployed=True,
                              end_orphans=end_orphans, deadline=deadline, stats=stats)  # fmt: skip
        return result

    def fetch(self, job_id: str, result: JobResult, out_dir: Path, progress: ByteProgress | None,
              only: tuple[str, ...] | None) -> dict[str, Path]:  # fmt: skip
        """Download the job's outputs, each verified (:func:`tasks.board.retrieve.retrieve`)."""
        return retrieve(self.conn, job_id, result, out_dir, self.board, progress, only)

    def install(self, recipe: str, version: Any) -> dict[str, Any]:
        """Install a registry version as the board's current release, verified there."""
        install_agent(self.conn, self.board)
        return install_version(self.conn, self.board, recipe, version)

    def list_dataset(self, path: str, fmt: str) -> dict[str, Any]:
        """The board's listing of its dataset folder ``path`` (files, sizes, sha256, samples)."""
        install_agent(self.conn, self.board)
        return list_dataset(self.conn, self.board, path, fmt)

    def running_job(self) -> str | None:
        """The id of the job training on the board, None when none is."""
        return running_job(self.conn, self.board)

    def cancel(self, job_id: str) -> None:
        """Cancel the job on the board (its last checkpoint kept)."""
        agent_json(self.conn, self.board, "cancel", job_dir(self.board, job_id))


@contextlib.contextmanager
def job_link(
    board: Board, conn: Transport | None = None, upload: tuple[str, ...] | None = None
) -> Iterator[JobLink]:
    """The link to ``board`` its inventory entry names, closed on exit (a caller's ``conn`` is the
    caller's to close). ``upload``: the outputs a pull-mode board sends back unasked (its default:
    the inference model and the trained tensors); a host drives the others and fetches what it wants."""
    if board.transport == "pull":
        yield PullLink(board) if upload is None else PullLink(board, upload=upload)
        return
    with connection(board, conn) as link:
        yield CommandLink(board, link)
