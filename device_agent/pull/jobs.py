"""The jobs a pull-mode board took from its host, followed until the host holds their result.

A ``train`` item becomes what the SSH path makes: its blobs in ``ROOT/blobs``, ``job.json``
written atomically under ``ROOT/jobs/<job_id>/`` (the same spec again is nothing new; another spec
under an id already on the board is refused for that job), started detached exactly as ``start``
does (:func:`~device_agent.job.launch.start_job`). The board remembers each job it took in
``ROOT/pull/jobs/<job_id>.json`` (the outputs to send back, whether a stop was asked, how often it
was resumed, whether the host has its result), so a restarted service goes on where it was: a job
left without a result (a reboot, a power cut) is started again from its last checkpoint, as is one
whose process died of a signal for the first time (CRASHED), :data:`MAX_RESUMES` times at most, as
the SSH follower does; its events are sent again from the host's offset.

Nothing is applied twice: an item for a job already taken changes nothing, a job that runs or has
a result is not started again, and a result is posted until the host has it (the host answers the
same result again as before). When the board cannot take a job (a spec in conflict, a blob that
never hashes right) or a stop finds it not running and without a result, the board sends a
``failed`` or ``cancelled`` result of its own making, which it does not write into the job folder.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from device_agent.atomic import atomic_write
from device_agent.errors import AgentError
from device_agent.job.jobdir import JobDir, lock_is_held, open_jobdir, read_result
from device_agent.job.jobstate import job_status
from device_agent.job.launch import cancel_job, start_job
from device_agent.protocol import (
    NEVER_RETRY,
    VERSION_KEY,
    ExitCode,
    JobResult,
    JobSpec,
    SpecError,
    valid_job_id,
)
from device_agent.pull.client import Client
from device_agent.pull.identity import pull_dir
from device_agent.pull.transfer import fetch_blobs, send_events, upload_output
from device_agent.sysinfo import versions

log = logging.getLogger("device_agent.pull")
MAX_RESUMES = 3  # starts of a job after its first, as the SSH follower (tasks/board/follow.py)
MAX_REFUSALS = 3  # 409s to a result before the board stops posting it
PERMANENT = NEVER_RETRY | {ExitCode.BLOB_MISMATCH}  # a job the board cannot take is failed with these


@dataclass
class Record:
    """What the board remembers of a job it took (``ROOT/pull/jobs/<job_id>.json``)."""

    job_id: str
    upload: list[str] = field(default_factory=list)
    started: bool = False
    stopped: bool = False
    resumes: int = 0
    refusals: int = 0
    closed: bool = False  # the host holds its result
    own_result: dict[str, Any] | None = None  # a result the board made (the job never ran as asked)


class Notes:
    """Logs a line for a key only when it differs from that key's last line: one line per change of state."""

    def __init__(self) -> None:
        self.last: dict[str, str] = {}

    def __call__(self, key: str, line: str, level: int = logging.INFO) -> None:
        if self.last.get(key) != line:
            self.last[key] = line
            log.log(level, "%s", line)


def item_id(item: dict[str, Any]) -> str:
    """A work item's id (a name: it names a folder and a route), else INVALID_SPEC."""
    try:
        return valid_job_id(item.get("id"))
    except SpecError as exc:
        raise AgentError(ExitCode.INVALID_SPEC, f"work item {exc}", "id") from exc


def create_job(root: Path, spec: JobSpec) -> JobDir:
    """``ROOT/jobs/<job_id>/job.json`` written atomically; the same spec already there is kept as is."""
    folder = root / "jobs" / spec.job_id
    if (folder / "job.json").exists():
        job = open_jobdir(folder, root)
        try:
            same = JobSpec.from_json(job.spec_file.read_text()).to_dict() == spec.to_dict()
        except (SpecError, OSError):
            same = False
        if not same:
            raise AgentError(ExitCode.INVALID_SPEC, f"job {spec.job_id}: a job.json with another spec is on the "
                                                    f"board already ({job.spec_file}): refused", "job_id")  # fmt: skip
        return job
    folder.mkdir(parents=True, exist_ok=True)
    job = open_jobdir(folder, root)
    atomic_write(job.spec_file, spec.to_json())
    return job


def made_result(
    job_id: str, status: str, code: ExitCode, error: str, job: JobDir | None = None
) -> dict[str, Any]:
    """A result of the board's making (not written to the job folder), its progress read from the job's events."""
    state = job_status(job) if job is not None and job.spec_file.exists() else {}
    return JobResult(job_id=job_id, status=status, exit_code=int(code), steps=int(state.get("step") or 0),
                     epochs_done=int(state.get("epoch") or 0), duration_s=0.0, train_loop_s=0.0, peak_rss_mb=0.0,
                     metrics={}, history=[], outputs={}, error=error, versions=versions()).to_dict()  # fmt: skip


class PullJobs:
    """The board's pull-mode jobs: taken from ``train`` items, stopped, followed at each check-in."""

    def __init__(self, client: Client, root: Path) -> None:
        self.client, self.root = client, root
        self.folder = pull_dir(root) / "jobs"
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self.records: dict[str, Record] = {}
        for path in sorted(self.folder.glob("*.json")):
            try:
                self.records[path.stem] = Record(**json.loads(path.read_text()))
            except (ValueError, TypeError) as exc:
                log.warning("%s: unreadable (%s): ignored", path, exc)
        self.offsets: dict[str, int] = {}  # the host's length of each job's events (None: ask)
        self.note = Notes()

    def save(self, rec: Record) -> None:
        self.records[rec.job_id] = rec
        atomic_write(self.folder / f"{rec.job_id}.json", json.dumps(asdict(rec), sort_keys=True))

    def take(self, item: dict[str, Any]) -> None:
        """A ``train`` item: its blobs and ``job.json``, then a record (the job starts as it is followed)."""
        job_id = item_id(item)
        rec = self.records.get(job_id)
        if rec is not None:
            if rec.closed:  # offered again: the host lacks its result; post it again
                self.save(Record(**{**asdict(rec), "closed": False, "refusals": 0}))
            return
        upload = item.get("upload", [])
        try:
            if not isinstance(upload, list) or not all(isinstance(u, str) for u in upload):
                raise AgentError(
                    ExitCode.INVALID_SPEC, f"upload: expected a list of output names (got {upload!r})"
                )
            spec = self._spec(job_id, item.get("spec"))
            fetch_blobs(self.client, self.root, item.get("blobs", {}))
            create_job(self.root, spec)
        except AgentError as exc:
            if exc.code not in PERMANENT:
                raise
            log.error("job %s: not taken: %s", job_id, exc)
            self.save(Record(job_id, own_result=made_result(job_id, "failed", exc.code, str(exc))))
            return
        self.save(Record(job_id, upload=upload))
        log.info("job %s: taken (job.json written, %d blobs present)", job_id, len(item.get("blobs") or {}))

    @staticmethod
    def _spec(job_id: str, spec: object) -> JobSpec:
        try:
            parsed = JobSpec.from_dict(spec)
        except SpecError as exc:
            code = ExitCode.PROTOCOL_MISMATCH if exc.field == VERSION_KEY else ExitCode.INVALID_SPEC
            raise AgentError(code, f"spec: {exc}", exc.field) from exc
        if parsed.job_id != job_id:
            raise AgentError(ExitCode.INVALID_SPEC, f"spec: field 'job_id': expected the item's id {job_id!r} "
                                                    f"(got {parsed.job_id!r})", "job_id")  # fmt: skip
        return parsed

    def stop(self, item: dict[str, Any]) -> None:
        """A ``stop`` item: the job is cancelled (it checkpoints) and never started again."""
        job_id = item_id(item)
        rec = self.records.get(job_id) or Record(job_id)
        folder = self.root / "jobs" / job_id
        if not rec.stopped:
            has_job = rec.own_result is not None or (folder / "job.json").is_file()
            own = (
                None
                if has_job
                else made_result(job_id, "cancelled", ExitCode.CANCELLED, "stopped before the board took it")
            )
            self.save(Record(**{**asdict(rec), "stopped": True, "own_result": rec.own_result or own}))
            log.info("job %s: stop asked", job_id)
        if (folder / "job.json").is_file() and rec.own_result is None:
            answer = cancel_job(open_jobdir(folder, self.root))
            if answer.get("cancel") != "not running":
                log.info("job %s: cancelling (pid %s)", job_id, answer.get("pid"))

    def follow_all(self) -> None:
        """Follow each job whose result the host does not hold yet; one job's error does not stop the others."""
        for rec in [r for r in self.records.values() if not r.closed]:
            try:
                self.follow(rec)
            except AgentError as exc:
                if exc.code == ExitCode.UNTRUSTED:
                    raise
                self.note(rec.job_id, f"job {rec.job_id}: {exc}", logging.WARNING)

    def follow(self, rec: Record) -> None:
        """Start or resume the job when it must run, send its new events, and once it has ended its outputs and result."""
        if rec.own_result is not None:
            self._post(rec, json.dumps(rec.own_result, sort_keys=True).encode())
            return
        folder = self.root / "jobs" / rec.job_id
        if not (folder / "job.json").is_file():  # removed from the board by hand: nothing left to run
            self._answer(rec, made_result(rec.job_id, "failed", ExitCode.JOB_NOT_FOUND, f"{folder} is gone"))
            return
        job = open_jobdir(folder, self.root)
        running = lock_is_held(job)
        result = read_result(job)  # after the lock: a result written as the job ends is seen with it
        if not running and not rec.stopped and self._should_start(rec, result):
            rec = self._start(rec, job)
            running, result = lock_is_held(job), read_result(job)
        self.offsets[rec.job_id] = send_events(
            self.client, rec.job_id, job.events, self.offsets.get(rec.job_id)
        )
        if running:
            return
        if result is None:
            if rec.stopped or rec.resumes >= MAX_RESUMES:
                self._give_up(rec, job)
            return
        for name in rec.upload:
            if name in result.outputs:
                upload_output(self.client, rec.job_id, job.path, name, result.outputs[name])
        self._post(rec, job.result_file.read_bytes())

    @staticmethod
    def _should_start(rec: Record, result: JobResult | None) -> bool:
        if rec.started and rec.resumes >= MAX_RESUMES:
            return False
        return result is None or (result.exit_code == ExitCode.CRASHED and result.status == "failed")

    def _start(self, rec: Record, job: JobDir) -> Record:
        again = rec.started
        try:
            answer = start_job(job)
        except AgentError as exc:
            if exc.code not in (ExitCode.BUSY, ExitCode.BOARD_BUSY):
                raise
            self.note(rec.job_id, f"job {rec.job_id}: waits: {exc}")
            return rec
        rec = Record(**{**asdict(rec), "started": True, "resumes": rec.resumes + int(again)})
        self.save(rec)
        log.info("job %s: %s (pid %s)", rec.job_id, "resumed" if again else "started", answer.get("pid"))
        return rec

    def _give_up(self, rec: Record, job: JobDir) -> None:
        """No result and the job will not run again: a stopped one is cancelled, a job that kept stopping failed."""
        if rec.stopped:
            made = made_result(rec.job_id, "cancelled", ExitCode.CANCELLED, "stopped while not running", job)
        else:
            made = made_result(rec.job_id, "failed", ExitCode.ENVIRONMENT, f"the job stopped {rec.resumes + 1} times "
                              "without a result (a reboot, a power cut or a kill each time; see agent.log in its "
                              "folder): not started again", job)  # fmt: skip
        self._answer(rec, made)

    def _answer(self, rec: Record, made: dict[str, Any]) -> None:
        """Keep a result of the board's making as the job's, and post it."""
        rec = Record(**{**asdict(rec), "own_result": made})
        self.save(rec)
        self._post(rec, json.dumps(made, sort_keys=True).encode())

    def _post(self, rec: Record, body: bytes) -> None:
        """Post the job's result; closed once the host holds it (or has refused it :data:`MAX_REFUSALS` times)."""
        answer = self.client.call("POST", f"jobs/{rec.job_id}/result", body)
        if answer.status == 200:
            self.save(Record(**{**asdict(rec), "closed": True}))
            log.info("job %s: result sent (%s)", rec.job_id, json.loads(body).get("status"))
        elif answer.status == 409:
            n = rec.refusals + 1
            self.save(Record(**{**asdict(rec), "refusals": n, "closed": n >= MAX_REFUSALS}))
            log.warning(
                "job %s: the host refused its result (%d of %d): %s",
                rec.job_id,
                n,
                MAX_REFUSALS,
                answer.error,
            )
        else:
            raise AgentError(ExitCode.ENVIRONMENT, f"job {rec.job_id}: result: the endpoint answered "
                                                   f"{answer.status}: {answer.error}")  # fmt: skip
