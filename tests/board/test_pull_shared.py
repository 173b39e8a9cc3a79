"""Pull mode over the shared store, as several worker hosts use it: a run on one host (its own
``ODL_HOME``) hands a job to a pull board through :class:`PullLink`, the one endpoint, running
with another ``ODL_HOME``, serves the board the job's blobs (with Range) and takes its events, its
output and its result, and the run's host reads the events and fetches the output, verified. A
blob damaged in the store is never served. (The endpoint's other behaviours run on both backends
in ``test_pull_endpoint.py``.)"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from device_agent.protocol import RUNTIME_ARTIFACTS, BlobRef, DataRef, Event, JobResult, JobSpec, TrainParams
from tasks.board.inventory import Board
from tasks.board.pull.link import PullLink
from tasks.board.pull.mailbox import Mailbox
from tasks.board.pull.records import POSTGRES, SQLITE
from tasks.store import configured_store
from tests.board.pull_kit import Signer, running_endpoint

JOB = "job-far"


def _file(folder: Path, name: str, data: bytes) -> tuple[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return hashlib.sha256(data).hexdigest(), folder / name


def _spec(model: tuple[str, Path], data: tuple[str, Path]) -> JobSpec:
    ref = BlobRef(model[0], model[1].stat().st_size)
    return JobSpec(job_id=JOB, artifacts=dict.fromkeys(RUNTIME_ARTIFACTS["autograd"], ref),
                   train_data=DataRef("npz", blob=BlobRef(data[0], data[1].stat().st_size)),
                   train=TrainParams(batch_size=4, epochs=1, lr=0.1), task="classification",
                   output_names=("logits",), runtime="autograd")  # fmt: skip


def _enrolled(ep, mailbox: Mailbox, name: str) -> Signer:
    board = Signer(name, ep)
    assert board.enrol(mailbox.invite(name)).json() == {"state": "accepted"}
    return board


def test_a_run_on_one_host_and_the_endpoint_on_another_share_the_mailbox(shared_store, tmp_path, monkeypatch):
    run_home, endpoint_home = tmp_path / "run-host", tmp_path / "endpoint-host"
    monkeypatch.setenv("ODL_HOME", str(run_home))
    link = PullLink(Board("b-far", "/home/odl/odl", transport="pull", pull_deadline_h=1))
    assert link.mailbox.root == run_home / "pull"
    model = _file(run_home / "work", "model.bin", os.urandom(300_000))  # only under the run's home
    data = _file(run_home / "work", "data.npz", os.urandom(5_000))
    files = {model[0]: model[1], data[0]: data[1]}
    out = os.urandom(200_000)
    out_sha = hashlib.sha256(out).hexdigest()
    events = b"".join(
        Event(kind, JOB, seq).to_json().encode() + b"\n" for seq, kind in enumerate(("started", "step"))
    )
    with running_endpoint(endpoint_home) as ep:
        board = _enrolled(ep, link.mailbox, "b-far")  # invited on the run's host, enrolled at the endpoint
        delivered = link.deliver(_spec(model, data), files, None)
        assert sorted(delivered.uploaded) == sorted(files) and delivered.skipped == []
        work = board.request("POST", "poll", {"info": {}, "jobs": {}}).json()["work"]
        assert [w["id"] for w in work] == [JOB] and link.mailbox.job(JOB).state == "offered"
        assert not (ep.mailbox.blobs / model[0]).exists()  # the endpoint's host never had the file
        whole = board.request("GET", f"blobs/{model[0]}")
        rest = board.request("GET", f"blobs/{model[0]}", extra={"Range": "bytes=123456-"})
        assert whole.status_code == 200 and whole.content == model[1].read_bytes()
        assert rest.status_code == 206 and rest.content == model[1].read_bytes()[123456:]
        assert board.request("POST", f"jobs/{JOB}/events?offset=0", events).json() == {"offset": len(events)}
        route = f"jobs/{JOB}/files/{out_sha}"
        half = board.request("PUT", f"{route}?offset=0&size={len(out)}", out[:70_000]).json()
        assert half == {"offset": 70_000, "complete": False}  # in the endpoint's uploads/ until whole
        rest = board.request("PUT", f"{route}?offset=70000&size={len(out)}", out[70_000:]).json()
        assert rest == {"offset": len(out), "complete": True}
        result = JobResult(JOB, "finished", 0, 2, 1, 1.0, 0.5, 10.0, {"train_loss": 0.5}, [], {}).to_dict()
        result["outputs"] = {"inference": {"path": "inference.onnx", "sha256": out_sha, "size": len(out)}}
        assert board.request("POST", f"jobs/{JOB}/result", result).json() == {"state": "finished"}
    assert not (run_home / "pull" / "blobs" / out_sha).exists()
    seen: list[Event] = []
    ended = link.run(_spec(model, data), files, seen.append)  # the job is final: its events, its result
    assert [(e.type, e.seq) for e in seen] == [("started", 0), ("step", 1)] and ended.steps == 2
    got = link.fetch(JOB, ended, tmp_path / "out", None, None)
    assert got["inference"].read_bytes() == out and (tmp_path / "out" / "events.jsonl").read_bytes() == events
    assert [*run_home.rglob("*.sqlite3"), *endpoint_home.rglob("*.sqlite3")] == []
    with configured_store().transaction() as conn:
        tables = {
            r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'odl_pull_%'")
        }
    assert tables == {f"odl_pull_{t}" for t in ("boards", "nonces", "jobs", "events", "job_blobs", "uploads")}


def test_a_blob_damaged_in_the_store_is_not_served(shared_store, tmp_path):
    submitter = Mailbox(tmp_path / "run-host")
    sha, path = _file(tmp_path / "run-host" / "work", "model.bin", b"weights " * 1000)
    with running_endpoint(tmp_path / "endpoint-host") as ep:
        board = _enrolled(ep, submitter, "b-damaged")
        item = {"kind": "train", "id": "job-damaged", "spec": {"job_id": "job-damaged"}, "upload": []}
        submitter.submit("b-damaged", item, {sha: path}, deadline=9e9)
        board.request("POST", "poll", {})
        with configured_store().transaction() as conn:
            conn.execute("UPDATE odl_blob_chunks SET data = %s WHERE sha256 = %s", (b"W" * 8000, sha))
        refused = board.request("GET", f"blobs/{sha}")
        assert refused.status_code == 503 and refused.json() == {
            "error": "the host's shared store is unavailable: try again later"
        }
        assert not (ep.mailbox.blobs / sha).exists()  # nothing unverified kept to serve later


@pytest.mark.parametrize(
    ("sql", "postgres"),
    [
        ("SELECT 1 FROM job_blobs b JOIN jobs j ON j.id=b.job_id WHERE b.sha=?",
         "SELECT 1 FROM odl_pull_job_blobs b JOIN odl_pull_jobs j ON j.id=b.job_id WHERE b.sha=%s"),
        ("UPDATE jobs SET verdict='board jobs events' WHERE events_len > ?",
         "UPDATE odl_pull_jobs SET verdict='board jobs events' WHERE events_len > %s"),
        ("INSERT INTO nonces (board) VALUES (?) ON CONFLICT (board) DO NOTHING",
         "INSERT INTO odl_pull_nonces (board) VALUES (%s) ON CONFLICT (board) DO NOTHING"),
    ],
    ids=["join", "literal", "upsert"],
)  # fmt: skip
def test_one_query_text_spelled_for_each_backend(sql, postgres):
    """Only a table's name after FROM, INTO, UPDATE, JOIN takes the prefix; a column or a word in a
    string keeps its name; SQLite runs the text as it is written."""
    assert SQLITE.sql(sql) == sql and POSTGRES.sql(sql) == postgres
