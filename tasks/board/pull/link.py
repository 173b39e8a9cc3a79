"""The job contract with a board that can only dial out: :class:`PullLink`.

``deliver`` checks the board (enrolled, accepted, and able to run the job by the ``info`` of its
last check-in) and puts the job and its blobs in the mailbox; ``run`` waits for the board to take
it, saying so in the run's log ("waiting for NAME to check in: last seen 3 min ago"), delivers its
events once each (by ``seq``) as they arrive, and ends when the job reaches a final state: a
finished result, TrainingFailed for a failed, cancelled or expired job (the verdict names the
deadline and when the board was last seen), Straggler past a fleet round's deadline. ``fetch``
copies the outputs the board sent, each verified again by its sha256.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from device_agent.protocol import BoardInfo, Event, JobResult, JobSpec, SpecError
from tasks.board.agent import check_info
from tasks.board.blobs import Delivered
from tasks.board.inventory import Board
from tasks.board.pull.mailbox import FINAL, Mailbox
from tasks.board.pull.watch import WAIT_LOG_S, JobWatch
from tasks.board.releases import RELEASE_FILES, checked_install
from tasks.board.transport import ByteProgress
from tasks.errors import BoardError, Straggler, TrainingFailed, TransferError
from tasks.hashing import file_sha256

log = logging.getLogger(__name__)

# the outputs a board sends back: the trained model, and the trained tensors a fleet round averages;
# the final checkpoint (the optimizer's state too: 3x the weights) stays on the board, as with SSH
UPLOAD = ("inference", "trainable")


def ago(seconds: float | None) -> str:
    """``3 min ago`` and the like; ``never`` for None."""
    if seconds is None:
        return "never"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


class PullLink:
    """The job contract over the host's mailbox (see the module's docstring)."""

    def __init__(
        self, board: Board, mailbox: Mailbox | None = None, upload: tuple[str, ...] = UPLOAD
    ) -> None:
        self.board, self.mailbox, self.upload = board, mailbox or Mailbox(), upload

    def accepted(self) -> Any:
        """The board's record; BoardError unless it enrolled and was accepted."""
        record = self.mailbox.board(self.board.name)
        name = self.board.name
        if record is None or record.state == "invited":
            raise BoardError(f"board {name} has not enrolled: on the board, `python3 -m device_agent enrol` "
                             f"with the code `odl board enrol {name}` printed")  # fmt: skip
        if record.state != "accepted":
            raise BoardError(f"board {name} is {record.state}" + (
                f": `odl board accept {name}` once its key fingerprint is checked" if record.state == "pending" else ""))  # fmt: skip
        return record

    def deliver(self, spec: JobSpec, files: dict[str, Path], progress: ByteProgress | None) -> Delivered:
        """Check the board as its last check-in describes it, then queue the job and its blobs."""
        record = self.accepted()
        info = BoardInfo.from_dict(record.info) if record.info else None
        if info is not None:
            check_info(self.board, info, spec.memory_estimate_mb, spec.runtime)
        had = self.mailbox.present_blobs(set(files))
        deadline = time.time() + self.board.pull_deadline_h * 3600
        item = {"kind": "train", "id": spec.job_id, "spec": spec.to_dict(), "upload": list(self.upload),
                "blobs": {sha: Path(p).stat().st_size for sha, p in files.items()}}  # fmt: skip
        self.mailbox.submit(self.board.name, item, files, deadline)
        new = sorted(set(files) - had)
        return Delivered(info, new, sorted(had), sum(Path(files[s]).stat().st_size for s in new))

    def run(self, spec: JobSpec, files: dict[str, Path], on_event: Any, *, end_orphans: bool = False,
            deadline: float | None = None, stats: Any = None) -> JobResult:  # fmt: skip
        """Follow the job in the mailbox until its final state (queued first when it is not there)."""
        if self.mailbox.job(spec.job_id) is None:
            self.deliver(spec, files, None)
        watch = JobWatch.of(self.mailbox)
        offset, last_seq, said, known = 0, -1, 0.0, None
        while True:
            left = WAIT_LOG_S if deadline is None else min(WAIT_LOG_S, deadline - time.monotonic())
            mark = watch.wait(spec.job_id, known, max(0.0, left))
            if mark is not None and mark != known:
                known = mark
                state, events_len = mark
                if events_len > offset:
                    data = self.mailbox.events(spec.job_id, offset)
                    end = data.rfind(b"\n") + 1
                    offset += end
                    for line in data[:end].decode(errors="replace").splitlines():
                        last_seq = self._deliver(line, last_seq, on_event)
                if state in FINAL:
                    job = self.mailbox.job(spec.job_id)
                    assert job is not None
                    return self._final(job)
            state = known[0] if known else "pending"
            if state in ("pending", "offered") and time.monotonic() - said >= WAIT_LOG_S:
                said = time.monotonic()
                self._say_waiting(state)
            if deadline is not None and time.monotonic() > deadline:
                raise Straggler(
                    f"board {self.board.name}: job {spec.job_id} was {state} at the round's deadline"
                )

    def _say_waiting(self, state: str) -> None:
        """Say what the run waits for, once a :data:`WAIT_LOG_S` for all the boards this process
        waits for (a fleet round waiting for 900 boards logs one line a minute, not 900)."""
        what = {"pending": "check in", "offered": "fetch the job and start it"}.get(state, state)
        boards = JobWatch.of(self.mailbox).say_waiting(self.board.name, what)
        if boards is None:
            return
        record = self.mailbox.board(self.board.name)
        seen = f"last seen {ago(record.seen_s if record else None)}"
        if len(boards) == 1:
            log.info("waiting for %s to %s: %s", self.board.name, what, seen)
            return
        others = [b for b in boards if b != self.board.name][:2]
        more = f" and {len(boards) - 1 - len(others)} more" if len(boards) > 1 + len(others) else ""
        log.info("waiting for %d boards to check in or start their jobs: %s (%s)%s%s", len(boards),
                 self.board.name, seen, "".join(f", {b}" for b in others), more)  # fmt: skip

    def _deliver(self, line: str, last_seq: int, on_event: Any) -> int:
        if not line.strip():
            return last_seq
        try:
            event = Event.from_json(line)
        except SpecError as exc:
            log.warning("board %s: unreadable event line skipped (%s)", self.board.name, exc)
            return last_seq
        if event.seq <= last_seq:
            return last_seq
        if on_event is not None:
            on_event(event)
        return event.seq

    def _final(self, job: Any) -> JobResult:
        if job.state == "expired":
            record = self.mailbox.board(self.board.name)
            seen = record.seen_s if record else None
            raise TrainingFailed(f"job {job.id} expired on board {self.board.name}: {job.verdict} "
                                 f"({self.board.pull_deadline_h:g} h; the board was last seen {ago(seen)})")  # fmt: skip
        result = JobResult.from_dict(job.result)
        if result.status != "finished":
            raise TrainingFailed(f"job {job.id} {result.status} (exit {result.exit_code}): {result.error}")
        return result

    def install(self, recipe: str, version: Any) -> dict[str, Any]:
        """Hand the board a registry version to install as its current release and wait for its
        answer (the same checks as over SSH: every file's sha256 verified on the board)."""
        files = version.verified_files(RELEASE_FILES)  # name -> (path, sha256 as recorded)
        hashes = {name: sha for name, (_, sha) in files.items()}
        item = {"kind": "install-model", "id": f"install-{version.name}-{secrets.token_hex(6)}", "recipe": recipe,
                "version": version.name, "files": hashes,
                "blobs": {sha: Path(p).stat().st_size for p, sha in files.values()}}  # fmt: skip
        answer = self._ask(
            item, {sha: Path(p) for p, sha in files.values()}, f"installing {recipe} {version.name}"
        )
        return checked_install(self.board, recipe, version.name, hashes, answer)

    def list_dataset(self, path: str, fmt: str) -> dict[str, Any]:
        """The board's listing of its dataset folder ``path`` (files, sizes, sha256, samples)."""
        item = {"kind": "list-dataset", "id": f"list-{secrets.token_hex(8)}", "path": path, "format": fmt}
        return self._ask(item, {}, f"listing {path}")

    def _ask(self, item: dict[str, Any], files: dict[str, Path], what: str) -> dict[str, Any]:
        """Queue a work item that is not a job and wait for the board's answer at a check-in."""
        self.accepted()
        self.mailbox.submit(self.board.name, item, files, time.time() + self.board.pull_deadline_h * 3600)
        watch, known, said = JobWatch.of(self.mailbox), None, 0.0
        while known is None or known[0] not in FINAL:
            known = watch.wait(item["id"], known, WAIT_LOG_S) or known
            state = known[0] if known else "pending"
            if state in ("pending", "offered") and time.monotonic() - said >= WAIT_LOG_S:
                said = time.monotonic()
                self._say_waiting("check in" if state == "pending" else "answer")
        job = self.mailbox.job(item["id"])
        assert job is not None
        answer = job.result or {}
        if job.state != "finished":
            raise TransferError(
                f"board {self.board.name}: {what}: {answer.get('error') or job.verdict or job.state}"
            )
        return answer

    def running_job(self) -> str | None:
        """The board's open training job in the mailbox (it trains one at a time), None when none is."""
        jobs = [j for j in self.mailbox.jobs(self.board.name) if j.kind == "train"]
        return jobs[-1].id if jobs else None

    def cancel(self, job_id: str) -> None:
        """Ask the board to stop the job at its next check-in (one it never took is cancelled now)."""
        self.mailbox.stop(job_id)

    def fetch(self, job_id: str, result: JobResult, out_dir: Path, progress: ByteProgress | None,
              only: tuple[str, ...] | None) -> dict[str, Path]:  # fmt: skip
        """Copy the outputs the board sent into ``out_dir``, each verified against ``result.json``."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        wanted = only or tuple(n for n in result.outputs if n in self.upload)
        got = {}
        for name in wanted:
            ref = result.outputs.get(name)
            src = self.mailbox.blob_file(ref.sha256) if ref else None  # verified, from either backend
            if ref is None or src is None:
                raise TransferError(f"job {job_id}: board {self.board.name} did not send its {name!r} output "
                                    f"(a pull-mode board sends {', '.join(self.upload)})")  # fmt: skip
            dest = out_dir / Path(ref.path).name
            shutil.copyfile(src, dest)
            if file_sha256(dest) != ref.sha256:
                dest.unlink()
                raise TransferError(f"job {job_id}: {name} does not hash to {ref.sha256[:12]} (removed)")
            if progress is not None:
                progress(ref.size, ref.size)
            got[name] = dest
        (out_dir / "result.json").write_text(result.to_json())
        (out_dir / "events.jsonl").write_bytes(self.mailbox.events(job_id))
        return got
