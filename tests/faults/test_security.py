"""Security: user input never escapes quoting or the agent root; planted symbolic links are never
followed by the agent (writes) or the host (downloads). The changed-host-key refusal is covered by
tests/e2e/test_transport_ssh.py::test_changed_host_key_is_refused, unsafe job ids by
tests/e2e/test_deploy.py::test_unsafe_job_ids_are_refused_before_anything_runs."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest

from device_agent.protocol import ExitCode, FileRef, JobResult
from tasks.board import agent, blobs, jobs, run
from tasks.board.inventory import Board, get_board, valid_board_name
from tasks.board.retrieve import retrieve
from tasks.board.transport import LocalTransport
from tasks.errors import BoardError, DeviceError, InvalidJob, RecipeError, RemoteCommandFailed, TransferError
from tasks.recipe.load import parse_recipe
from tests.prepare.kit import BASE, merge

EVIL = ["a;touch MARK", "$(touch MARK)", "`touch MARK`", "a\ntouch MARK", "../x", "/etc/passwd", "..", ""]
LINKS = ["events.jsonl", "agent.log", "agent.pid", ".lock", "inference.onnx.tmp", "result.json.tmp",
         "checkpoints"]  # fmt: skip
SECRET = "not to be overwritten nor downloaded\n"


@pytest.mark.parametrize("name", EVIL)
def test_unsafe_recipe_and_board_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(BASE, {"name": name}), tmp_path / "r.toml")
    assert info.value.field == "name"
    with pytest.raises(BoardError, match="board name"):
        valid_board_name(name)
    with pytest.raises(BoardError):
        get_board(name, tmp_path / "inventory.toml")


@pytest.mark.parametrize("path", ["../../etc/passwd", "data/../../x", "", "a\0b"])
def test_board_dataset_path_cannot_climb_out_of_the_root(tmp_path: Path, path: str) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(BASE, {"data": {"train": None, "board_train": path}}), tmp_path / "r.toml")
    assert info.value.field == "data.board_train"


@pytest.mark.parametrize("name", [*EVIL, "A" * 64, "0" * 63])
def test_blob_names_that_are_not_a_sha256_are_refused_before_anything_runs(
    local_board: Board, tmp_path: Path, name: str
) -> None:
    src = tmp_path / "payload"
    src.write_text(SECRET)
    before = sorted(Path(local_board.root).rglob("*"))
    with pytest.raises(InvalidJob, match="blob name"):
        blobs.upload_blobs(LocalTransport(), local_board, {name: src})
    assert sorted(Path(local_board.root).rglob("*")) == before
    assert not list(Path.cwd().glob("MARK")) and not (tmp_path / "MARK").exists()


def test_an_upload_whose_hash_differs_never_lands(local_board: Board, tmp_path: Path) -> None:
    src = tmp_path / "payload"
    src.write_text(SECRET)
    liar = "f" * 64
    with pytest.raises(TransferError, match="hash mismatch after upload"):
        blobs.upload_blobs(LocalTransport(), local_board, {liar: src}, retries=2)
    assert os.listdir(posixpath.join(local_board.root, "blobs")) == []


def _job(conn: LocalTransport, board: Board, digits_job, job_id: str, **train) -> str:
    spec, files = digits_job(job_id, **train)
    blobs.upload_blobs(conn, board, files)
    return jobs.create_job(conn, board, spec)


@pytest.mark.parametrize("name", LINKS)
def test_agent_refuses_a_job_folder_with_a_planted_link(
    local_board: Board, digits_job, tmp_path: Path, name: str
) -> None:
    conn = LocalTransport()
    jdir = _job(conn, local_board, digits_job, f"link-{name.strip('.').replace('.', '-')}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text(SECRET)
    os.symlink(outside if name == "checkpoints" else outside / "victim", posixpath.join(jdir, name))
    for command in ("start", "run", "validate", "status"):
        res = conn.run(agent.agent_argv(local_board, command, jdir), check=False)
        assert res.code == ExitCode.INVALID_SPEC, (command, res.stdout, res.stderr)
        assert "symbolic link" in res.stdout
    with pytest.raises(RemoteCommandFailed, match="symbolic link"):
        jobs.start_job(conn, local_board, posixpath.basename(jdir))
    assert (outside / "victim").read_text() == SECRET and os.listdir(outside) == ["victim"]
    assert not os.path.exists(posixpath.join(jdir, "result.json"))


def test_agent_refuses_a_job_folder_that_is_a_link(local_board: Board, digits_job, tmp_path: Path) -> None:
    conn = LocalTransport()
    real = _job(conn, local_board, digits_job, "real-job")
    fake = posixpath.join(local_board.root, "jobs", "linked-job")
    os.symlink(real, fake)
    res = conn.run(agent.agent_argv(local_board, "start", fake), check=False)
    assert res.code == ExitCode.INVALID_SPEC and "not a real folder" in res.stdout
    assert not os.path.exists(posixpath.join(real, "events.jsonl"))


def test_host_does_not_download_through_a_planted_link(
    local_board: Board, digits_job, tmp_path: Path
) -> None:
    conn = LocalTransport()
    spec, files = digits_job("fetch-link", epochs=1)
    _, result = run.drive_job(conn, local_board, spec, files)
    jdir = jobs.job_dir(local_board, spec.job_id)
    victim = tmp_path / "victim"
    victim.write_text(SECRET)
    os.unlink(posixpath.join(jdir, "agent.log"))
    os.symlink(victim, posixpath.join(jdir, "agent.log"))
    out = tmp_path / "out"
    with pytest.raises(DeviceError, match="symbolic link"):
        retrieve(conn, spec.job_id, result, out, local_board)
    assert not any(SECRET in p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    os.unlink(posixpath.join(jdir, "agent.log"))
    for rel in ("../fetch-link/inference.onnx", "/etc/passwd", "a/../../x", "./inference.onnx"):
        forged = JobResult.from_dict(
            result.to_dict() | {"outputs": {"x": FileRef(rel, "0" * 64, 1).to_dict()}}
        )
        with pytest.raises(DeviceError, match="plain path inside the job folder"):
            retrieve(conn, spec.job_id, forged, out, local_board)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odl", "out", "victim"]
    assert list(out.iterdir()) == []
