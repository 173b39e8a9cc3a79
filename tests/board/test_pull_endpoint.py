"""The pull-mode endpoint as boards meet it, through a real uvicorn TLS server: enrolment with a
one-time code or an operator's accept, signed requests (replays, stale times, another board's
name, a revoked board refused in one line), a board fetching only its own blobs with Range, events
from an offset, resumable verified outputs, a result applied once, and 429 under overload. Each
runs on both mailboxes: the local one (SQLite and a folder) and the shared store's (PostgreSQL)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from device_agent.protocol import JobResult
from tests.board.pull_kit import Signer, running_endpoint


@pytest.fixture(scope="module")
def local_endpoint(tmp_path_factory: pytest.TempPathFactory):
    with running_endpoint(tmp_path_factory.mktemp("pull")) as ep:
        yield ep


@pytest.fixture(params=["local", "shared"])
def backend(request: pytest.FixtureRequest) -> str:
    """The mailbox's backend: ``shared`` sets ODL_STORE_URL to a database of the test's own."""
    if request.param == "shared":
        request.getfixturevalue("shared_store")
    return request.param


@pytest.fixture
def endpoint(backend: str, request: pytest.FixtureRequest, tmp_path: Path):
    """The local endpoint of the module, or one over the test's shared store."""
    if backend == "local":
        yield request.getfixturevalue("local_endpoint")
        return
    with running_endpoint(tmp_path / "endpoint") as ep:
        assert ep.mailbox.shared is not None and not (tmp_path / "endpoint" / "mailbox.sqlite3").exists()
        yield ep


def _enrolled(endpoint, name: str) -> Signer:
    board = Signer(name, endpoint)
    reply = board.enrol(endpoint.mailbox.invite(name))
    assert reply.status_code == 200 and reply.json() == {"state": "accepted"}, reply.text
    return board


def _blob(tmp_path: Path, data: bytes) -> tuple[str, Path]:
    path = tmp_path / hashlib.sha256(data).hexdigest()[:8]
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest(), path


def _job(endpoint, board: str, job_id: str, blobs: dict[str, Path], upload=("inference",), deadline_s=600):
    item = {"kind": "train", "id": job_id, "spec": {"job_id": job_id},
            "blobs": {sha: p.stat().st_size for sha, p in blobs.items()}, "upload": list(upload)}  # fmt: skip
    return endpoint.mailbox.submit(board, item, blobs, time.time() + deadline_s)


def test_enrolment_by_code_or_accept_and_what_a_refused_request_reads(endpoint):
    wrong = Signer("b-wrong", endpoint)
    endpoint.mailbox.invite("b-wrong")
    assert wrong.enrol("not-the-code").status_code == 403
    pending = Signer("b-pending", endpoint)
    assert pending.enrol(None).status_code == 202
    poll = pending.request("POST", "poll", {"info": {}, "jobs": {}})
    assert poll.status_code == 403 and "odl board accept b-pending" in poll.json()["error"]
    endpoint.mailbox.accept("b-pending")
    assert pending.request("POST", "poll", {"info": {}, "jobs": {}}).status_code == 200
    stranger = Signer("b-stranger", endpoint)
    assert stranger.request("POST", "poll", {}).json()["error"] == "board b-stranger has not enrolled"


def test_signed_requests_refuse_replays_stale_times_and_another_boards_name(endpoint):
    a, b = _enrolled(endpoint, "b-a"), _enrolled(endpoint, "b-b")
    body = json.dumps({"info": {}, "jobs": {}}).encode()
    headers = a.headers("POST", "/odl/v1/poll", body)
    with httpx.Client(verify=str(endpoint.cert)) as client:
        first = client.post(endpoint.url + "/odl/v1/poll", content=body, headers=headers)
        again = client.post(endpoint.url + "/odl/v1/poll", content=body, headers=headers)
        tampered = client.post(
            endpoint.url + "/odl/v1/poll",
            content=body + b" ",
            headers=a.headers("POST", "/odl/v1/poll", body),
        )
    assert first.status_code == 200
    assert again.status_code == 401 and "replay" in again.json()["error"]
    assert tampered.status_code == 401 and "does not verify" in tampered.json()["error"]
    stale = a.request("POST", "poll", body, ts=int(time.time()) - 3600)
    assert stale.status_code == 401 and re.search(r"360[01] s behind the host.s", stale.json()["error"])
    posing = a.request("POST", "poll", body, as_board="b-b")  # a's key, b's name
    assert posing.status_code == 401 and "board b-b's key" in posing.json()["error"]
    assert b.request("POST", "poll", body).status_code == 200


def test_a_board_fetches_its_own_blobs_only_and_resumes_with_range(endpoint, tmp_path):
    a, b = _enrolled(endpoint, "b-fetch"), _enrolled(endpoint, "b-other")
    data = bytes(range(256)) * 40
    sha, path = _blob(tmp_path, data)
    _job(endpoint, "b-fetch", "job-fetch", {sha: path})
    work = a.request("POST", "poll", {"info": {}, "jobs": {}}).json()
    assert [w["id"] for w in work["work"]] == ["job-fetch"] and work["sleep_s"] == 2.0
    assert endpoint.mailbox.job("job-fetch").state == "offered"
    whole = a.request("GET", f"blobs/{sha}")
    assert whole.status_code == 200 and whole.content == data
    rest = a.request("GET", f"blobs/{sha}", extra={"Range": "bytes=5000-"})
    assert rest.status_code == 206 and rest.content == data[5000:]
    other = b.request("GET", f"blobs/{sha}")
    assert other.status_code == 403 and "not one of board b-other's jobs" in other.json()["error"]
    assert b.request("POST", "jobs/job-fetch/events?offset=0", b"{}\n").status_code == 403


def test_events_outputs_and_a_result_that_is_applied_once(endpoint, tmp_path):
    a = _enrolled(endpoint, "b-run")
    sha_in, path = _blob(tmp_path, b"model bytes")
    _job(endpoint, "b-run", "job-run", {sha_in: path})
    a.request("POST", "poll", {})
    assert a.request("POST", "jobs/job-run/events?offset=0", b'{"type":"started"}\n').json() == {"offset": 19}
    gap = a.request("POST", "jobs/job-run/events?offset=5", b"x")
    assert gap.status_code == 409 and gap.json()["offset"] == 19
    assert endpoint.mailbox.job("job-run").state == "running"
    out = b"trained model" * 1000
    sha = hashlib.sha256(out).hexdigest()
    route = f"jobs/job-run/files/{sha}"
    assert a.request("PUT", f"{route}?offset=0&size={len(out)}", out[:5000]).json() == {
        "offset": 5000,
        "complete": False,
    }
    assert a.request("GET", route).json() == {"offset": 5000}  # a cut upload asks where to go on
    done = a.request("PUT", f"{route}?offset=5000&size={len(out)}", out[5000:])
    assert done.json() == {"offset": len(out), "complete": True}
    result = JobResult("job-run", "finished", 0, 3, 1, 1.0, 0.5, 10.0, {}, [], {})
    text = result.to_dict() | {
        "outputs": {"inference": {"path": "inference.onnx", "sha256": sha, "size": len(out)}}
    }
    assert a.request("POST", "jobs/job-run/result", text).json() == {"state": "finished"}
    assert a.request("POST", "jobs/job-run/result", text).json() == {
        "state": "finished"
    }  # the same: as before
    other = a.request("POST", "jobs/job-run/result", text | {"steps": 99})
    assert other.status_code == 409 and "not applied" in other.json()["error"]
    assert endpoint.mailbox.job("job-run").result["steps"] == 3
    assert endpoint.mailbox.events("job-run") == b'{"type":"started"}\n'


def test_a_tampered_output_is_dropped_and_a_result_without_its_outputs_refused(endpoint, tmp_path):
    a = _enrolled(endpoint, "b-tamper")
    sha_in, path = _blob(tmp_path, b"in")
    _job(endpoint, "b-tamper", "job-tamper", {sha_in: path})
    a.request("POST", "poll", {})
    claimed = hashlib.sha256(b"the real model").hexdigest()
    bad = a.request("PUT", f"jobs/job-tamper/files/{claimed}?offset=0&size=14", b"the fake model")
    assert bad.status_code == 422 and "do not hash" in bad.json()["error"]
    assert a.request("GET", f"jobs/job-tamper/files/{claimed}").json() == {"offset": 0}
    result = JobResult("job-tamper", "finished", 0, 1, 1, 1.0, 0.5, 10.0, {}, [], {}).to_dict()
    result["outputs"] = {"inference": {"path": "inference.onnx", "sha256": claimed, "size": 14}}
    refused = a.request("POST", "jobs/job-tamper/result", result)
    assert refused.status_code == 409 and "inference are not uploaded" in refused.json()["error"]
    assert endpoint.mailbox.job("job-tamper").state == "offered"


def test_revocation_deadline_and_malformed_requests(endpoint, tmp_path):
    a = _enrolled(endpoint, "b-revoke")
    sha_in, path = _blob(tmp_path, b"in2")
    _job(endpoint, "b-revoke", "job-late", {sha_in: path}, deadline_s=-1)
    assert a.request("POST", "poll", {}).json()["work"] == []
    late = endpoint.mailbox.job("job-late")
    assert late.state == "expired" and "before the deadline" in late.verdict
    assert a.request("POST", "jobs/job-late/events?offset=x", b"").status_code == 400
    assert a.request("POST", "poll", b"[1, 2").json()["error"].startswith("poll: expected a JSON object")
    endpoint.mailbox.revoke("b-revoke")
    refused = a.request("POST", "poll", {})
    assert refused.status_code == 403 and refused.json() == {"error": "board b-revoke is revoked"}


def test_an_overloaded_endpoint_answers_429_with_retry_after(tmp_path):
    with running_endpoint(tmp_path, max_inflight=1) as ep:
        slow = Signer("b-slow", ep)
        gate = threading.Event()
        original = ep.mailbox.poll

        def held(*args):
            gate.wait(10)
            return original(*args)

        slow.enrol(None)
        ep.mailbox.accept("b-slow")
        ep.mailbox.poll = held
        first = threading.Thread(target=lambda: slow.request("POST", "poll", {}))
        first.start()
        time.sleep(0.5)
        busy = slow.request("POST", "poll", {})
        gate.set()
        first.join(10)
    assert busy.status_code == 429 and int(busy.headers["Retry-After"]) >= 5


def test_an_idle_boards_check_in_is_held_until_work_arrives(backend, tmp_path):
    """A long poll: the check-in of an idle board (wait_s 10) is answered within a second of a job's
    submission, not at its next check-in; held, it does not count as load (max_inflight=1 still
    answers another board); with nothing to hand out it ends at wait_s, telling the board to ask again."""
    with running_endpoint(tmp_path, max_inflight=1) as ep:
        a, b = _enrolled(ep, "b-held"), _enrolled(ep, "b-other2")
        sha, path = _blob(tmp_path, b"held")
        got: dict = {}

        def held() -> None:
            t0 = time.monotonic()
            got["reply"] = a.request("POST", "poll", {"info": {}, "jobs": {}, "wait_s": 10}).json()
            got["s"] = time.monotonic() - t0

        poller = threading.Thread(target=held)
        poller.start()
        time.sleep(1.0)
        assert b.request("POST", "poll", {}).status_code == 200  # the held one is not load
        _job(ep, "b-held", "job-held", {sha: path})
        submitted = time.monotonic()
        poller.join(15)
        answered_after = time.monotonic() - submitted  # the poller has returned by now
        assert [w["id"] for w in got["reply"]["work"]] == ["job-held"]
        assert answered_after < 8 and got["s"] < 9.5, got  # answered when the job came, before the hold ended
        t0 = time.monotonic()
        empty = b.request("POST", "poll", {"info": {}, "jobs": {}, "wait_s": 1.5}).json()
        assert empty == {"sleep_s": 1.0, "work": []} and time.monotonic() - t0 >= 1.4
        # revoked while its check-in is held: refused at the next look for work, not when the hold ends
        got.clear()
        poller = threading.Thread(target=lambda: got.update(
            r=b.request("POST", "poll", {"info": {}, "jobs": {}, "wait_s": 20})))  # fmt: skip
        poller.start()
        time.sleep(1.0)
        ep.mailbox.revoke("b-other2")
        revoked = time.monotonic()
        poller.join(25)
        assert got["r"].status_code == 403 and got["r"].json() == {"error": "board b-other2 is revoked"}
        assert time.monotonic() - revoked < 15  # well before the 20 s hold would have ended
