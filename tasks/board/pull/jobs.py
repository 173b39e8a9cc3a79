"""Jobs handed to pull-mode boards, as the host's runs see them: submit, read, stop, expire."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from device_agent.protocol import valid_blob_name, valid_job_id
from tasks.board.pull.blobs import Blobs
from tasks.board.pull.records import JOB_COLUMNS, OPEN, JobRecord, Refused, job_from_row
from tasks.errors import BoardError


class Jobs(Blobs):
    """The jobs' part of the mailbox (the host's side of it)."""

    def submit(self, board: str, item: dict[str, Any], files: dict[str, Path], deadline: float) -> JobRecord:
        """Hand ``item`` (a contract work item: ``kind``, ``id`` ...) to ``board`` with the blobs it
        names, copied into the mailbox by sha256. Idempotent on the item's id: the same item again
        returns its record as it is; another item under that id is refused."""
        job_id = valid_job_id(item["id"])
        for sha, path in files.items():
            self.add_blob(valid_blob_name(sha), path)
        text = json.dumps(item, sort_keys=True)
        with self.tx() as db:
            row = db.execute("SELECT item, board FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row is not None:  # the same job again (a run retried or resumed): as it is
                if json.loads(row[0]).get("spec") != item.get("spec") or row[1] != board:
                    raise BoardError(f"job {job_id} was handed to {row[1]} already with another spec")
            else:
                db.execute(
                    "INSERT INTO jobs (id, board, kind, state, item, created, deadline)"
                    " VALUES (?, ?, ?, 'pending', ?, ?, ?)",
                    (job_id, board, item["kind"], text, time.time(), deadline),
                )
                db.executemany("INSERT INTO job_blobs VALUES (?, ?)", [(job_id, s) for s in files])
        return self.job(job_id)  # type: ignore[return-value]

    def job(self, job_id: str) -> JobRecord | None:
        """The job's record (its deadline applied first), None when unknown."""
        self.expire_overdue()
        with self.read() as db:
            row = db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return job_from_row(row) if row else None

    def marks(self, ids: list[str]) -> dict[str, tuple[str, int]]:
        """Each known job of ``ids``: its state and the bytes of events it holds (one query for all
        of them: what a process following many jobs reads each tick, :class:`~tasks.board.pull.watch.JobWatch`)."""
        self.expire_overdue()
        out: dict[str, tuple[str, int]] = {}
        with self.read() as db:
            for start in range(0, len(ids), 500):  # SQLite's bound parameters: 999 at most by default
                part = ids[start : start + 500]
                rows = db.execute(
                    f"SELECT id, state, events_len FROM jobs WHERE id IN ({','.join('?' * len(part))})", part
                ).fetchall()
                out.update({r[0]: (r[1], int(r[2])) for r in rows})
        return out

    def jobs(self, board: str, states: tuple[str, ...] = OPEN) -> list[JobRecord]:
        """The board's jobs in ``states``, oldest first."""
        marks = ",".join("?" * len(states))
        with self.read() as db:
            rows = db.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE board=? AND state IN ({marks}) ORDER BY created",
                (board, *states),
            ).fetchall()
        return [job_from_row(r) for r in rows]

    def expire_overdue(self, now: float | None = None) -> int:
        """Every open job past its deadline becomes ``expired``; how many did."""
        now = time.time() if now is None else now
        with self.read() as db:  # most calls find none: a read, without the writers' lock
            due = db.execute(
                f"SELECT 1 FROM jobs WHERE state IN {OPEN} AND deadline < ? LIMIT 1", (now,)
            ).fetchone()
        if due is None:
            return 0
        with self.tx() as db:
            cur = db.execute(
                f"UPDATE jobs SET state='expired', ended=?, verdict='the board reported no final state "
                f"before the deadline' WHERE state IN {OPEN} AND deadline < ?",
                (now, now),
            )
        return cur.rowcount

    def stop(self, job_id: str) -> JobRecord | None:
        """Ask the board to stop the job at its next check-in (a job it never fetched is cancelled)."""
        with self.tx() as db:
            db.execute(
                "UPDATE jobs SET state='cancelled', ended=?, verdict='stopped before the board fetched it'"
                " WHERE id=? AND state='pending'",
                (time.time(), job_id),
            )
            db.execute(
                "UPDATE jobs SET state='stopping' WHERE id=? AND state IN ('offered', 'running')", (job_id,)
            )
        return self.job(job_id)

    def may_fetch(self, board: str, sha: str) -> Path:
        """A verified file of blob ``sha`` when one of ``board``'s open jobs names it, else Refused (403/404)."""
        with self.read() as db:
            row = db.execute(
                f"SELECT 1 FROM job_blobs b JOIN jobs j ON j.id=b.job_id WHERE b.sha=? AND j.board=?"
                f" AND j.state IN {OPEN}",
                (sha, board),
            ).fetchone()
        if row is None:
            raise Refused(403, f"blob {sha[:12]} is not one of board {board}'s jobs")
        path = self.blob_file(sha)
        if path is None:
            raise Refused(404, f"blob {sha[:12]} is missing from the mailbox")
        return path
