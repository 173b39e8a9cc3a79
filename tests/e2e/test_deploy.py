"""Content-addressed upload, agent install and job-id safety against the virtual board."""

from __future__ import annotations

import hashlib
import os
import posixpath
import secrets
from pathlib import Path

import pytest

from device_agent.protocol import BlobRef, DataRef, JobSpec, TrainParams
from tasks import stages
from tasks.board import follow, jobs
from tasks.board.agent import install_agent
from tasks.board.blobs import upload_blobs
from tasks.board.inventory import Board
from tasks.board.transport import connect
from tasks.errors import InvalidJob, TransferError

pytestmark = pytest.mark.board
MARK = "odl-pwned-marker"  # a name nothing else on the machine uses
BAD_IDS = [
    "../evil",
    f"a;touch {MARK}",
    f"$(touch {MARK})",
    "..",
    "a/b",
    "-rf",
    f"x`touch {MARK}`",
    "ok..no",
    "",
    "a b",
]


def _blob(tmp: Path, size: int) -> tuple[str, Path]:
    path = tmp / f"blob-{secrets.token_hex(4)}.bin"
    path.write_bytes(secrets.token_bytes(size))
    return hashlib.sha256(path.read_bytes()).hexdigest(), path


def _spec(job_id: str) -> JobSpec:
    ref = BlobRef("0" * 64, 1)
    return JobSpec(
        job_id=job_id,
        artifacts={k: ref for k in ("training_model", "eval_model", "optimizer_model", "checkpoint")},
        train_data=DataRef("npz", blob=ref),
        train=TrainParams(batch_size=1, epochs=1, lr=0.1),
        task="classification",
        output_names=("logits",),
    )


def _tree(path: str) -> list[tuple[str, int]]:
    """Every file under ``path`` with its mtime (ns), as root sees it on this machine."""
    out = []
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            out.append((full, os.lstat(full).st_mtime_ns))
    return sorted(out)


def test_upload_sends_only_what_the_board_lacks(virtual_board: Board, tmp_path: Path) -> None:
    files = dict([_blob(tmp_path, 1_500_000), _blob(tmp_path, 10)])
    conn = connect(virtual_board)
    try:
        install_agent(conn, virtual_board)  # blobs are listed and verified by the agent
        seen: list[tuple[int, int]] = []
        first = upload_blobs(conn, virtual_board, files, progress=lambda d, t: seen.append((d, t)))
        assert first.bytes_sent == 1_500_010 and sorted(first.uploaded) == sorted(files) and not first.skipped
        assert seen[-1] == (1_500_010, 1_500_010)
        second = upload_blobs(conn, virtual_board, files)
        assert (second.bytes_sent, second.uploaded, sorted(second.skipped)) == (0, [], sorted(files))
        blobs = posixpath.join(virtual_board.root, "blobs")
        for sha in files:
            out = conn.run(["sha256sum", posixpath.join(blobs, sha)]).stdout.split()[0]
            assert out == sha
    finally:
        conn.close()


def test_wrong_size_blob_is_replaced_and_bad_hash_never_lands(virtual_board: Board, tmp_path: Path) -> None:
    sha, path = _blob(tmp_path, 200_000)
    blobs = posixpath.join(virtual_board.root, "blobs")
    conn = connect(virtual_board)
    try:
        install_agent(conn, virtual_board)
        upload_blobs(conn, virtual_board, {})  # creates blobs/
        conn.run(["sh", "-c", 'head -c 1000 /dev/zero > "$1"', "sh", posixpath.join(blobs, sha)])
        report = upload_blobs(conn, virtual_board, {sha: path})
        assert report.uploaded == [sha]
        assert conn.run(["sha256sum", posixpath.join(blobs, sha)]).stdout.split()[0] == sha
        liar = "f" * 64
        with pytest.raises(TransferError, match="hash mismatch"):
            upload_blobs(conn, virtual_board, {liar: path}, retries=2)
        names = conn.run(["ls", "-A", blobs]).stdout.split()
        # none of this test's temporaries is left (other tests on the shared board may leave theirs)
        assert liar not in names and not [n for n in names if n.startswith((f".tmp-{liar}", f".tmp-{sha}"))]
    finally:
        conn.close()


@pytest.mark.parametrize("job_id", BAD_IDS)
def test_unsafe_job_ids_are_refused_before_anything_runs(virtual_board: Board, job_id: str) -> None:
    home = posixpath.dirname(virtual_board.root)
    before = _tree(home)
    with pytest.raises(InvalidJob, match="refused"):
        stages.train(virtual_board, _spec(job_id), {})
    conn = connect(virtual_board)
    try:
        with pytest.raises(InvalidJob):
            jobs.create_job(conn, virtual_board, _spec(job_id))
        with pytest.raises(InvalidJob):
            follow.follow_job(conn, virtual_board, job_id)
    finally:
        conn.close()
    assert _tree(home) == before  # nothing written on the board side (the remote shell's cwd is home)
    for where in (Path.cwd(), Path("/tmp"), Path(home), Path(home).parent):  # nor where a shell would run
        assert not (where / MARK).exists() and not (where / "evil").exists()


def test_same_job_id_with_another_spec_is_refused(virtual_board: Board) -> None:
    job_id = f"conflict-{secrets.token_hex(3)}"
    conn = connect(virtual_board)
    try:
        jdir = jobs.create_job(conn, virtual_board, _spec(job_id))
        assert jdir == posixpath.join(virtual_board.root, "jobs", job_id)
        assert jobs.create_job(conn, virtual_board, _spec(job_id)) == jdir  # same spec: idempotent
        other = JobSpec.from_dict(_spec(job_id).to_dict() | {"task": "regression"})
        with pytest.raises(InvalidJob, match="different spec"):
            jobs.create_job(conn, virtual_board, other)
        conn.run(["rm", "-rf", jdir])
    finally:
        conn.close()
