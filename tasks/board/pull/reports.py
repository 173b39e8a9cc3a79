"""What a pull-mode board asks and sends, as the mailbox answers it: the work of a check-in, its
events from an offset, its outputs in resumable pieces, the result that ends a job, the answer of
a work item that is not a job. Each request concerns the board's own jobs only (403 otherwise)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from device_agent.protocol import JobResult, SpecError, file_sha256, valid_blob_name
from tasks.board.pull.blobs import Blobs
from tasks.board.pull.records import FINAL, JOB_COLUMNS, OPEN, JobRecord, Refused, job_from_row

SLEEP_IDLE_S = 30.0  # a board with nothing to do checks in this often ...
SLEEP_BUSY_S = 2.0  # ... and this often while one of its jobs is open (events, stop)


class Reports(Blobs):
    """The boards' side of the mailbox (its methods need ``job``, ``jobs`` and ``expire_overdue``)."""

    def poll(self, board: str, info: dict[str, Any] | None) -> tuple[list[dict[str, Any]], float, bool]:
        """A board's check-in in one transaction: when it was seen (and its ``info``: what its agent
        said of itself), the work items to hand it now (its pending and offered jobs, again so that a
        board that lost a reply gets them back, and a stop for each stopping one), how long it may
        sleep, and whether it has an open job."""
        now = time.time()
        work = []
        with self.tx() as db:
            if info is None:
                db.execute("UPDATE boards SET last_seen=? WHERE name=?", (now, board))
            else:
                db.execute(
                    "UPDATE boards SET last_seen=?, info=? WHERE name=?", (now, json.dumps(info), board)
                )
            rows = db.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE board=? AND state IN {OPEN} AND deadline >= ? ORDER BY created",
                (board, now),
            ).fetchall()
            jobs = [job_from_row(r) for r in rows]
            for job in jobs:
                if job.state == "stopping":
                    work.append({"kind": "stop", "id": job.id})
                elif job.state in ("pending", "offered"):
                    work.append(job.item)
            db.execute("UPDATE jobs SET state='offered', offered=? WHERE board=? AND state='pending'"
                       " AND deadline >= ?", (now, board, now))  # fmt: skip
        return work, SLEEP_BUSY_S if jobs else SLEEP_IDLE_S, bool(jobs)

    def boards_with_work(self) -> set[str]:
        """The boards that have a job to take or to stop, or were revoked (one query for every held
        check-in: a revoked board's held check-in is refused at once, not when its hold ends)."""
        with self.read() as db:
            rows = db.execute(
                "SELECT DISTINCT board FROM jobs WHERE state IN ('pending', 'stopping')"
                " UNION SELECT name FROM boards WHERE state = 'revoked'"
            ).fetchall()
        return {r[0] for r in rows}

    def own_job(self, board: str, job_id: str) -> JobRecord:
        """``job_id`` when it is ``board``'s, else Refused (404 unknown, 403 another board's)."""
        job = self.job(job_id)  # type: ignore[attr-defined]
        if job is None:
            raise Refused(404, f"job {job_id} is not in the mailbox")
        if job.board != board:
            raise Refused(403, f"job {job_id} is not board {board}'s")
        return job

    def append_events(self, board: str, job_id: str, offset: int, data: bytes) -> int:
        """Append the bytes of ``events.jsonl`` from ``offset``: the new length; Refused 409 with the
        host's length when ``offset`` is not it (the board sends again from there)."""
        job = self.own_job(board, job_id)
        if offset != job.events_len:
            raise Refused(409, f"job {job_id}: events from byte {offset}, the host has {job.events_len}",
                          offset=job.events_len)  # fmt: skip
        if not data:
            return offset
        with self.tx() as db:  # the offset checked again where it is written: two posts at once, one wins
            moved = db.execute(
                "UPDATE jobs SET events_len=?, state=CASE WHEN state='offered' THEN 'running' ELSE state END"
                " WHERE id=? AND events_len=?",
                (offset + len(data), job_id, offset),
            ).rowcount
            if moved == 1:
                db.execute(
                    'INSERT INTO events (job_id, "offset", data) VALUES (?, ?, ?)', (job_id, offset, data)
                )
        if moved != 1:
            have = self.own_job(board, job_id).events_len
            raise Refused(409, f"job {job_id}: events from byte {offset}, the host has {have}", offset=have)
        return offset + len(data)

    def events(self, job_id: str, offset: int = 0) -> bytes:
        """The job's ``events.jsonl`` bytes from ``offset`` as the board sent them."""
        with self.read() as db:
            rows = db.execute(
                'SELECT "offset", data FROM events WHERE job_id=? AND "offset" + length(data) > ? ORDER BY "offset"',
                (job_id, offset),
            ).fetchall()
        return b"".join(bytes(data)[max(0, offset - start) :] for start, data in rows)

    def upload_offset(self, board: str, job_id: str, sha: str) -> int:
        """How many bytes of the output ``sha`` the host has (its size once complete)."""
        self.own_job(board, job_id)
        valid_blob_name(sha)
        done = self.blob_file(sha)
        if done is not None:
            return done.stat().st_size
        part = self._part(job_id, sha)
        return part.stat().st_size if part.exists() else 0

    def put_chunk(
        self, board: str, job_id: str, sha: str, offset: int, size: int, data: bytes
    ) -> dict[str, Any]:
        """Write bytes from ``offset`` of output ``sha`` (of ``size`` bytes); once complete, its
        sha256 is checked (Refused 422 and the part dropped when it differs) and it joins the blobs."""
        job = self.own_job(board, job_id)
        if job.final:
            raise Refused(409, f"job {job_id} is {job.state}: it takes no more outputs")
        valid_blob_name(sha)
        if self.present_blobs({sha}):
            return {"offset": size, "complete": True}
        have = self.upload_offset(board, job_id, sha)
        if offset != have or offset + len(data) > size or size < 0:
            raise Refused(409, f"output {sha[:12]}: bytes from {offset} ({len(data)} of {size}), the host has {have}",
                          offset=have)  # fmt: skip
        part = self._part(job_id, sha)
        part.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "ab") as f:
            f.write(data)
        have = offset + len(data)
        if have < size:
            return {"offset": have, "complete": False}
        if file_sha256(part) != sha:
            part.unlink()
            raise Refused(422, f"output {sha[:12]} of job {job_id}: its bytes do not hash to it (dropped)")
        self.keep_blob(sha, part)
        return {"offset": size, "complete": True}

    def _part(self, job_id: str, sha: str) -> Path:
        return self.root / "uploads" / job_id / sha

    def finish(self, board: str, job_id: str, text: str) -> JobRecord:
        """The job's ``result.json``: its final state, once every output it lists that the job's
        ``upload`` names is here and verified. The same result twice is answered as before; another one is refused."""
        job = self.own_job(board, job_id)
        try:
            result = JobResult.from_json(text)
        except (SpecError, ValueError) as exc:
            raise Refused(400, f"job {job_id}: result.json is malformed: {exc}") from exc
        if result.job_id != job_id:
            raise Refused(400, f"job {job_id}: result.json names job {result.job_id}")
        if job.final:
            if job.result == result.to_dict():
                return job
            raise Refused(409, f"job {job_id} is {job.state} already: another result is not applied")
        have = self.present_blobs({ref.sha256 for ref in result.outputs.values()})
        missing = [
            name for name in job.item.get("upload", [])
            if name in result.outputs and result.outputs[name].sha256 not in have
        ]  # fmt: skip
        if missing:
            raise Refused(409, f"job {job_id}: outputs {', '.join(missing)} are not uploaded and verified")
        state = {"finished": "finished", "cancelled": "cancelled"}.get(result.status, "failed")
        with self.tx() as db:
            db.execute(
                f"UPDATE jobs SET state=?, ended=?, result=? WHERE id=? AND state IN {OPEN}",
                (state, time.time(), json.dumps(result.to_dict()), job_id),
            )
        return self.own_job(board, job_id)

    def answer(self, board: str, work_id: str, answer: dict[str, Any]) -> JobRecord:
        """The answer of a work item that is not a job (``install-model``): its final state."""
        job = self.own_job(board, work_id)
        if job.kind == "train":
            raise Refused(400, f"{work_id} is a training job: its result goes to jobs/{work_id}/result")
        if job.final:
            if job.result == answer:
                return job
            raise Refused(409, f"{work_id} is {job.state} already: another answer is not applied")
        state = "failed" if "error" in answer else "finished"
        with self.tx() as db:
            db.execute(
                f"UPDATE jobs SET state=?, ended=?, result=? WHERE id=? AND state IN {OPEN}",
                (state, time.time(), json.dumps(answer), work_id),
            )
        return self.own_job(board, work_id)


__all__ = ["FINAL", "Reports"]
