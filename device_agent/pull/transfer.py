"""What a pull-mode board moves over its :class:`~device_agent.pull.client.Client`: blobs down,
``events.jsonl`` and outputs up, each resumable from where the other side stands.

- **Blobs** are fetched into ``ROOT/blobs/.tmp-<sha256>-<hex>`` (:func:`~device_agent.protocol.blob_tmp_name`);
  a cut download resumes with ``Range: bytes=N-`` (an earlier partial file of that blob is found
  by its name, even after a restart), and the complete file goes through the agent's own
  :func:`~device_agent.data.blobstore.put_blob`, which verifies its sha256 and renames it into place.
  A hash mismatch drops the partial (``put_blob`` removes it) and fetches again from byte 0, at most
  :data:`BLOB_ATTEMPTS` tries in all.
- **Events** are posted from the host's offset, whole lines only, :data:`~device_agent.pull.contract.CHUNK`
  bytes a request; a 409 names the host's offset, and sending goes on from there.
- **Outputs** go up in ``CHUNK`` pieces after asking the host how much it has, so a cut upload
  resumes from the host's offset (a 409 names it too).
"""

from __future__ import annotations

import http.client
import logging
import re
import secrets
from pathlib import Path

from device_agent.data.blobstore import blob_store, list_blobs, put_blob
from device_agent.errors import AgentError
from device_agent.protocol import (
    BLOB_TMP_PREFIX,
    ExitCode,
    FileRef,
    SpecError,
    blob_tmp_name,
    valid_blob_name,
)
from device_agent.pull.client import Answer, Client, backoff_s
from device_agent.pull.contract import CHUNK

log = logging.getLogger("device_agent.pull")
BLOB_ATTEMPTS = 5  # tries of one blob (cuts and mismatches together)
CONFLICTS = 8  # 409s with an offset one upload or events round follows before giving up
RANGE_RE = re.compile(r"^bytes (\d+)-")


def fetch_blobs(client: Client, root: Path, blobs: object) -> None:
    """Fetch each blob of ``blobs`` ({sha256: size}) the store does not hold at that size."""
    if not isinstance(blobs, dict):
        raise AgentError(
            ExitCode.INVALID_SPEC, f"blobs: expected an object {{sha256: size}} (got {blobs!r})", "blobs"
        )
    have = list_blobs(root).blobs
    for sha, size in blobs.items():
        try:
            valid_blob_name(sha, "blobs")
        except SpecError as exc:
            raise AgentError(ExitCode.INVALID_SPEC, str(exc), "blobs") from exc
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise AgentError(
                ExitCode.INVALID_SPEC, f"blobs.{sha}: expected a size >= 0 (got {size!r})", "blobs"
            )
        if have.get(sha) != size:
            fetch_blob(client, root, sha, size)


def _partial(store: Path, sha: str) -> Path:
    """The largest earlier download of ``sha`` under its temporary name, else a new name."""
    parts = sorted(store.glob(f"{BLOB_TMP_PREFIX}{sha}-*"), key=lambda p: p.stat().st_size, reverse=True)
    return parts[0] if parts else store / blob_tmp_name(sha, secrets.token_hex(8))


def fetch_blob(client: Client, root: Path, sha: str, size: int) -> None:
    """Fetch blob ``sha`` of ``size`` bytes into the store, resuming cut downloads; one line when it cannot."""
    store = blob_store(root)
    tmp, why, code = _partial(store, sha), "", ExitCode.ENVIRONMENT
    for attempt in range(BLOB_ATTEMPTS):
        have = tmp.stat().st_size if tmp.exists() else 0
        if have < size:
            why = _download(client, sha, tmp, have)
            have = tmp.stat().st_size if tmp.exists() else 0
        if have == size:
            try:
                put_blob(root, str(tmp), sha)
                log.info("blob %s: fetched (%d bytes, sha256 verified)", sha[:12], size)
                return
            except AgentError as exc:
                if exc.code != ExitCode.BLOB_MISMATCH:
                    raise
                why, code = f"{exc} (the partial download is dropped)", ExitCode.BLOB_MISMATCH
        elif have > size:
            why, code = f"the endpoint sent {have} bytes, {size} expected (dropped)", ExitCode.BLOB_MISMATCH
            tmp.unlink()
        else:
            why, code = f"cut at {have} of {size} bytes: {why}", ExitCode.ENVIRONMENT
        log.warning("blob %s: %s; trying again", sha[:12], why)
        if not tmp.exists():
            tmp = store / blob_tmp_name(sha, secrets.token_hex(8))
        if attempt + 1 < BLOB_ATTEMPTS and code == ExitCode.ENVIRONMENT:
            client.sleep(backoff_s(attempt))
    raise AgentError(code, f"blob {sha}: not fetched in {BLOB_ATTEMPTS} tries: {why}", "blobs")


def _download(client: Client, sha: str, tmp: Path, have: int) -> str:
    """One GET of the blob into ``tmp`` from byte ``have``; "" when the body came whole, else why not."""
    resp = client.open("GET", f"blobs/{sha}", headers={"Range": f"bytes={have}-"} if have else {})
    if resp.status == 206:
        start = RANGE_RE.match(resp.getheader("Content-Range") or "")
        if start is None or int(start.group(1)) != have:
            client.close()
            return f"asked from byte {have}, answered {resp.getheader('Content-Range')!r}"
    elif resp.status != 200:
        answer = Answer.parse(resp.status, resp.read())
        raise AgentError(
            ExitCode.ENVIRONMENT, f"blob {sha}: the endpoint answered {answer.status}: {answer.error}"
        )
    whole = False
    try:
        with open(tmp, "ab" if resp.status == 206 else "wb") as fh:  # 200: the host sends it all again
            while block := resp.read(CHUNK):
                fh.write(block)
            fh.flush()
        whole = resp.isclosed() and resp.length in (None, 0)
        return "" if whole else "the body ended early"
    except (OSError, http.client.HTTPException) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        if not whole:
            client.close()


def send_events(client: Client, job_id: str, path: Path, offset: int | None) -> int:
    """Post ``events.jsonl`` from the host's ``offset`` (None: not known yet, asked first with an empty
    body); the host's offset after. Whole lines only, ``CHUNK`` bytes a request."""
    if offset is None:
        offset = _post_events(client, job_id, 0, b"")
    for _ in range(CONFLICTS + 64):
        data = _lines(path, offset)
        if not data:
            return offset
        offset = _post_events(client, job_id, offset, data)
    return offset


def _lines(path: Path, offset: int) -> bytes:
    """Up to ``CHUNK`` bytes of ``path`` from ``offset``, cut after its last newline."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(CHUNK)
    except FileNotFoundError:
        return b""
    end = data.rfind(b"\n") + 1
    return data[:end] if end or len(data) < CHUNK else data  # a line longer than CHUNK goes in pieces


def _post_events(client: Client, job_id: str, offset: int, data: bytes) -> int:
    answer = client.call("POST", f"jobs/{job_id}/events", data, query={"offset": offset})
    host = answer.data.get("offset")
    if answer.status in (200, 409) and isinstance(host, int) and host >= 0:
        if answer.status == 409 and data:  # (an empty body only asks where the host stands)
            log.info(
                "job %s: the host has %d bytes of its events, not %d: sending from there",
                job_id,
                host,
                offset,
            )
        return host
    raise AgentError(ExitCode.ENVIRONMENT, f"job {job_id}: events from byte {offset}: the endpoint answered "
                                           f"{answer.status}: {answer.error}")  # fmt: skip


def upload_output(client: Client, job_id: str, folder: Path, name: str, ref: FileRef) -> None:
    """Send output ``name`` (``ref``: its path in the job folder, sha256, size) from the host's offset."""
    path = (folder / ref.path).resolve()
    what = f"job {job_id}: output {name} ({ref.path})"
    if folder.resolve() not in path.parents or not path.is_file():
        raise AgentError(ExitCode.ARTIFACT_INVALID, f"{what}: not a file in the job folder", "upload")
    route = f"jobs/{job_id}/files/{ref.sha256}"
    answer = client.call("GET", route)
    offset = _offset(answer, what)
    complete, conflicts = 0 < ref.size <= offset, 0
    with open(path, "rb") as fh:
        while not complete:
            fh.seek(offset)
            data = fh.read(min(CHUNK, max(ref.size - offset, 0)))
            answer = client.call("PUT", route, data, query={"offset": offset, "size": ref.size})
            if answer.status == 409 and isinstance(answer.data.get("offset"), int) and conflicts < CONFLICTS:
                conflicts += 1
                log.info(
                    "%s: the host has %s bytes, not %d: sending from there",
                    what,
                    answer.data["offset"],
                    offset,
                )
            elif answer.status != 200 or (not data and not answer.data.get("complete")):
                raise AgentError(
                    ExitCode.ENVIRONMENT, f"{what}: the endpoint answered {answer.status}: {answer.error}"
                )
            offset, complete = _offset(answer, what), bool(answer.data.get("complete"))
    log.info("%s: sent (%d bytes)", what, ref.size)


def _offset(answer: Answer, what: str) -> int:
    offset = answer.data.get("offset")
    if answer.status not in (200, 409) or not isinstance(offset, int) or offset < 0:
        raise AgentError(
            ExitCode.ENVIRONMENT, f"{what}: the endpoint answered {answer.status}: {answer.error}"
        )
    return offset
