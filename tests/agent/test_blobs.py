"""The agent's blob store: ``blobs`` lists ROOT/blobs and removes uploads a dropped link left behind;
``put-blob`` verifies an upload, makes it read-only and renames it into place, and refuses any
argument that is not an upload inside ROOT/blobs without touching a file."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

import pytest

from device_agent.protocol import STALE_TMP_S, BlobListing, BlobRef, ExitCode, blob_tmp_name

SECRET = b"not to be moved nor removed\n"


def _upload(root: Path, data: bytes, sha: str | None = None, nonce: str = "0123abcd") -> tuple[str, Path]:
    sha = sha or hashlib.sha256(data).hexdigest()
    tmp = root / "blobs" / blob_tmp_name(sha, nonce)
    tmp.write_bytes(data)
    return sha, tmp


def _tree(root: Path) -> list[tuple[str, bool, int]]:
    return sorted((str(p), p.is_symlink(), p.lstat().st_mode) for p in root.rglob("*"))


def test_put_blob_verifies_then_renames_read_only(agent_board) -> None:
    sha, tmp = _upload(agent_board.root, b"weights")
    run = agent_board.run("put-blob", str(tmp), sha)
    assert run.code == ExitCode.OK, run.err
    assert BlobRef.from_dict(run.last, "put-blob") == BlobRef(sha, 7)
    final = agent_board.root / "blobs" / sha
    assert final.read_bytes() == b"weights" and stat.S_IMODE(final.stat().st_mode) == 0o444
    assert sorted(os.listdir(agent_board.root / "blobs")) == [sha]


def test_put_blob_removes_an_upload_whose_hash_differs(agent_board) -> None:
    liar = "f" * 64
    _, tmp = _upload(agent_board.root, b"anything but f", sha=liar)
    run = agent_board.run("put-blob", str(tmp), liar)
    assert run.code == ExitCode.BLOB_MISMATCH and run.last["cause"] == "BLOB_MISMATCH"
    assert f"blob {liar}: the upload hashes to" in run.last["error"] and "job_id" not in run.last
    assert os.listdir(agent_board.root / "blobs") == []


def _unsafe_cases(root: Path, outside: Path) -> dict[str, tuple[str, str]]:
    data = SECRET
    sha = hashlib.sha256(data).hexdigest()
    name = blob_tmp_name(sha, "0123abcd")
    (outside / name).write_bytes(data)
    (root / "jobs").mkdir()
    (root / "jobs" / name).write_bytes(data)
    os.symlink(outside / name, root / "blobs" / blob_tmp_name(sha, "0000ffff"))
    (root / "blobs" / blob_tmp_name(sha, "1111ffff")).mkdir()
    (root / "blobs" / "plain-name").write_bytes(data)
    return {
        "sha-traversal": (str(root / "blobs" / name), "../" + sha[3:]),
        "sha-uppercase": (str(root / "blobs" / name), sha.upper()),
        "sha-empty": (str(root / "blobs" / name), ""),
        "tmp-outside-root": (str(outside / name), sha),
        "tmp-in-jobs": (str(root / "jobs" / name), sha),
        "tmp-climbs-out": (str(root / "blobs" / ".." / "jobs" / name), sha),
        "tmp-relative-climbs-out": (f"../{outside.name}/{name}", sha),  # the agent's cwd is the root
        "tmp-not-an-upload-name": (str(root / "blobs" / "plain-name"), sha),
        "tmp-symlink": (str(root / "blobs" / blob_tmp_name(sha, "0000ffff")), sha),
        "tmp-directory": (str(root / "blobs" / blob_tmp_name(sha, "1111ffff")), sha),
        "tmp-missing": (str(root / "blobs" / blob_tmp_name(sha, "2222ffff")), sha),
        "tmp-is-the-root": (str(root), sha),
    }


CASES = ["sha-traversal", "sha-uppercase", "sha-empty", "tmp-outside-root", "tmp-in-jobs", "tmp-climbs-out",
         "tmp-relative-climbs-out", "tmp-not-an-upload-name", "tmp-symlink", "tmp-directory", "tmp-missing",
         "tmp-is-the-root"]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_put_blob_refuses_what_is_not_an_upload_in_blobs(agent_board, tmp_path: Path, case: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    tmp, sha = _unsafe_cases(agent_board.root, outside)[case]
    before, outside_before = _tree(agent_board.root), _tree(outside)
    run = agent_board.run("put-blob", tmp, sha)
    assert run.code == ExitCode.INVALID_ARGUMENT, (run.out, run.err)
    assert (
        run.last["cause"] == "INVALID_ARGUMENT"
        and run.last["field"] == {"sha": "sha256", "tmp": "tmp"}[case[:3]]
    )
    assert _tree(agent_board.root) == before and _tree(outside) == outside_before
    assert all(p.read_bytes() == SECRET for p in outside.iterdir())


def test_blobs_lists_the_store_and_removes_stale_uploads(agent_board) -> None:
    blobs = agent_board.root / "blobs"
    sha, _ = _upload(agent_board.root, b"kept blob")
    (blobs / blob_tmp_name(sha, "0123abcd")).rename(blobs / sha)
    fresh = _upload(agent_board.root, b"still uploading", nonce="aaaaaaaa")[1]
    stale = _upload(agent_board.root, b"cut off", nonce="bbbbbbbb")[1]
    old = time.time() - STALE_TMP_S - 60
    os.utime(stale, (old, old))
    (blobs / "notes.txt").write_text("not a blob")
    os.utime(blobs / sha, (old, old))  # an old blob is a blob, not a leftover
    run = agent_board.run("blobs")
    assert run.code == ExitCode.OK, run.err
    listing = BlobListing.from_dict(run.last)
    assert listing.blobs == {sha: len(b"kept blob")} and listing.free > 0
    assert sorted(os.listdir(blobs)) == sorted([sha, fresh.name, "notes.txt"])


def test_blobs_creates_the_store_and_refuses_a_linked_one(agent_board, tmp_path: Path) -> None:
    os.rmdir(agent_board.root / "blobs")
    run = agent_board.run("blobs")
    assert run.code == ExitCode.OK and run.last["blobs"] == {} and (agent_board.root / "blobs").is_dir()
    os.rmdir(agent_board.root / "blobs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, agent_board.root / "blobs")
    for args in (
        ("blobs",),
        ("put-blob", str(agent_board.root / "blobs" / blob_tmp_name("0" * 64, "0123abcd")), "0" * 64),
    ):
        run = agent_board.run(*args)
        assert run.code == ExitCode.INVALID_ARGUMENT and "symbolic link" in run.last["error"]
    assert list(elsewhere.iterdir()) == []
