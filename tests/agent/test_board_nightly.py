"""Board-side commands of the nightly loop, run for real: ``dataset`` listings of a growing folder,
jobs pinned to its shards, ``install-model``/``models`` and the one-job-at-a-time board lock."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from device_agent.data.datasets import ShardDataset
from device_agent.job.events import read_events
from device_agent.protocol import DataFile, DataRef, ExitCode

DS = "datasets/digits"
BOUNDS = (150, 270)  # digits train (400 samples) -> shards of 150, 120 and 130 rows
SHARDS = ("shard-0001.npz", "shard-0002.npz", "shard-0003.npz")


def digits_arrays(spec, files) -> dict[str, np.ndarray]:
    with np.load(files[spec.train_data.blob.sha256]) as z:
        return {k: z[k] for k in z.files}


def write_shard(folder: Path, name: str, arrays: dict[str, np.ndarray]) -> None:
    """As a board application does: write under a hidden name, then rename into place."""
    tmp = folder / f".{name}.tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(tmp, folder / name)


def make_shards(board, spec, files) -> Path:
    arrays = digits_arrays(spec, files)
    folder = board.root / DS
    folder.mkdir(parents=True)
    for name, part in zip(SHARDS, np.split(np.arange(len(arrays["y"])), BOUNDS), strict=True):
        write_shard(folder, name, {k: v[part] for k, v in arrays.items()})
    return folder


def listing(board, path: str = DS, *extra: str) -> dict:
    res = board.run("dataset", path, *extra)
    assert res.code == 0, res.err
    return res.last


def pinned(spec, listed: list[dict]):
    pins = (
        DataFile(f["name"], f["sha256"], f["size"], f["samples"]) for f in listed
    )  # "arrays": listing only
    ref = DataRef("npz-shards", path=DS, files=tuple(pins))
    return replace(spec, train_data=ref)


def started(jdir: Path) -> dict:
    return [e["data"] for e in read_events(jdir / "events.jsonl") if e["type"] == "started"][-1]


def test_dataset_lists_visible_shards_hashed_and_cached(agent_board, digits_job):
    spec, files = digits_job("unused")
    folder = make_shards(agent_board, spec, files)
    (folder / ".shard-0000.npz").write_bytes((folder / SHARDS[0]).read_bytes())  # hidden
    (folder / ".shard-0004.npz.tmp").write_bytes(b"being written")
    (folder / "x.part").write_bytes(b"partial")
    (folder / "notes.txt").write_text("not a shard")

    first = listing(agent_board)
    assert first["format"] == "npz-shards" and first["classes"] == []
    assert Path(first["path"]) == folder.resolve()
    assert [f["name"] for f in first["files"]] == list(SHARDS)
    for f in first["files"]:
        data = (folder / f["name"]).read_bytes()
        assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["size"] == len(data)
    assert [f["samples"] for f in first["files"]] == [150, 120, 130] and first["samples"] == 400
    assert all(f["arrays"] == ["x", "y"] for f in first["files"])  # what tells an unlabeled shard
    cached = list((agent_board.root / "cache" / "datasets").glob("*.json"))
    assert len(cached) == 1

    arrays = digits_arrays(spec, files)
    write_shard(folder, "shard-0004.npz", {k: v[:50] for k, v in arrays.items()})
    second = listing(agent_board, str(folder))  # absolute path: the same folder, the same cache
    assert second["files"][:3] == first["files"]
    assert [f["name"] for f in second["files"]] == [*SHARDS, "shard-0004.npz"]
    new = second["files"][3]
    assert new["samples"] == 50 and second["samples"] == 450
    assert new["sha256"] == hashlib.sha256((folder / "shard-0004.npz").read_bytes()).hexdigest()
    assert list((agent_board.root / "cache" / "datasets").glob("*.json")) == cached


def test_dataset_lists_image_folder_with_classes(agent_board):
    from PIL import Image

    folder = agent_board.root / "datasets" / "pics"
    for name in ("cat/b.png", "cat/a.png", "dog/c.png", "dog/.d.png", "dog/e.png.part", ".git/f.png"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("L", (8, 8), color=len(name)).save(folder / name, format="PNG")
    (folder / "README.txt").write_text("not a class")
    got = listing(agent_board, "datasets/pics", "--format", "image-folder")
    assert got["format"] == "image-folder" and got["classes"] == ["cat", "dog"]
    assert [f["name"] for f in got["files"]] == ["cat/a.png", "cat/b.png", "dog/c.png"]
    assert all(f["samples"] == 1 for f in got["files"]) and got["samples"] == 3
    for f in got["files"]:
        assert f["sha256"] == hashlib.sha256((folder / f["name"]).read_bytes()).hexdigest()


def test_missing_dataset_folder_and_escaping_path(agent_board):
    assert agent_board.run("dataset", "datasets/none").code == ExitCode.DATA_MISMATCH
    assert agent_board.run("dataset", "../elsewhere").code == ExitCode.INVALID_ARGUMENT


def test_jobs_train_on_exactly_the_pinned_shards(agent_board, digits_job):
    spec, files = digits_job("shards-all", epochs=1)
    make_shards(agent_board, spec, files)
    listed = listing(agent_board)["files"]
    jdir = agent_board.install(pinned(spec, listed), files)
    run = agent_board.run("run", str(jdir))
    assert run.code == 0 and run.last["status"] == "finished", run.err
    assert started(jdir)["train_samples"] == sum(f["samples"] for f in listed) == 400
    assert run.last["steps"] == -(-400 // spec.train.batch_size)

    two, _ = digits_job("shards-two", epochs=1)
    jdir2 = agent_board.install(pinned(two, [listed[0], listed[2]]), files)
    run2 = agent_board.run("run", str(jdir2))
    assert run2.code == 0 and run2.last["status"] == "finished", run2.err
    assert started(jdir2)["train_samples"] == 150 + 130
    assert run2.last["steps"] == -(-280 // spec.train.batch_size)


def test_shard_dataset_take_matches_concatenation(tmp_path):
    rng = np.random.default_rng(7)
    sizes, shards, paths = (5, 1, 9, 4), [], []
    for i, n in enumerate(sizes):
        arrays = {"x": rng.normal(size=(n, 1, 8, 8)).astype(np.float32), "y": rng.integers(0, 10, n)}
        paths.append(tmp_path / f"s{i}.npz")
        np.savez(paths[-1], **arrays)
        shards.append(arrays)
    ds = ShardDataset(paths, ["input", "labels"], {"input": "x", "labels": "y"}, "train_data")
    assert len(ds) == sum(sizes)
    whole = {k: np.concatenate([s[k] for s in shards]) for k in ("x", "y")}
    for idx in (rng.integers(0, len(ds), 40), rng.permutation(len(ds)), np.array([18, 0, 5, 5, 17])):
        got = ds.take(idx)
        np.testing.assert_array_equal(got["input"], whole["x"][idx])
        np.testing.assert_array_equal(got["labels"], whole["y"][idx])


def test_changed_or_removed_pinned_shard_is_refused(agent_board, digits_job):
    spec, files = digits_job("rewritten", epochs=1)
    folder = make_shards(agent_board, spec, files)
    listed = listing(agent_board)["files"]
    jdir = agent_board.install(pinned(spec, listed), files)
    gone_spec, _ = digits_job("removed", epochs=1)
    gone_dir = agent_board.install(pinned(gone_spec, listed), files)

    with np.load(folder / SHARDS[1]) as z:  # same shapes and size, other labels
        arrays = {"x": z["x"], "y": (z["y"] + 1) % 10}
    write_shard(folder, SHARDS[1], arrays)
    assert (folder / SHARDS[1]).stat().st_size == listed[1]["size"]
    run = agent_board.run("run", str(jdir))
    assert run.code == ExitCode.DATA_MISMATCH and run.last["status"] == "failed", run.err
    assert "train_data.files[1]" in run.last["error"] and "changed" in run.last["error"]
    failed = [e["data"] for e in read_events(jdir / "events.jsonl") if e["type"] == "failed"]
    assert failed[-1]["field"] == "train_data.files[1]"
    assert not (jdir / "checkpoints").exists() or not any((jdir / "checkpoints").iterdir())

    (folder / SHARDS[2]).unlink()
    run = agent_board.run("run", str(gone_dir))
    assert run.code == ExitCode.DATA_MISMATCH, run.err
    assert "train_data.files[1]" in run.last["error"]  # checked in order: files[1] changed first
    spec3, _ = digits_job("removed-only", epochs=1)
    jdir3 = agent_board.install(pinned(spec3, [listed[0], listed[2]]), files)
    run = agent_board.run("run", str(jdir3))
    assert run.code == ExitCode.DATA_MISMATCH and "train_data.files[1]" in run.last["error"], run.err
    assert "not on the board" in run.last["error"]


def put(root: Path, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    (root / "blobs" / sha).write_bytes(data)
    return sha


def test_install_model_switches_rolls_back_and_refuses_bad_blobs(agent_board, digits_job, tmp_path):
    spec, files = digits_job("unused")
    root, models = agent_board.root, agent_board.root / "models" / "digits"
    v1 = files[spec.artifacts["eval_model"].sha256].read_bytes()
    v2, int8 = v1 + b"\0second model", b"an int8 model"
    a, b, c = put(root, v1), put(root, v2), put(root, int8)

    first = agent_board.run("install-model", "digits", "v0001", f"model.onnx={a}")
    assert first.code == 0, first.err
    assert first.last["changed"] is True and first.last["hook"] is None
    assert first.last["current"]["version"] == "v0001" and first.last["previous"] is None
    assert (models / "current.onnx").read_bytes() == v1
    hook_log = tmp_path / "hook.log"
    (models / "on-change").write_text(f'#!/bin/sh\necho "$1" >> {hook_log}\n')
    (models / "on-change").chmod(0o755)

    second = agent_board.run("install-model", "digits", "v0002", f"model.onnx={b}", f"model.int8.onnx={c}")
    assert second.code == 0, second.err
    assert second.last["hook"]["exit_code"] == 0 and hook_log.read_text() == "v0002\n"
    assert (models / "current.onnx").read_bytes() == v2
    assert (models / "current.int8.onnx").read_bytes() == int8
    r1, r2 = f"v0001-{a[:12]}", f"v0002-{b[:12]}"  # releases are named by version and content
    assert os.readlink(models / "current") == f"releases/{r2}"
    assert os.readlink(models / "previous") == f"releases/{r1}"
    answer = agent_board.run("models", "digits")
    assert answer.code == 0, answer.err
    cur, prev = answer.last["current"], answer.last["previous"]
    assert cur["version"] == "v0002" and cur["verified"] is True
    assert cur["files"] == {"model.onnx": b, "model.int8.onnx": c}
    assert prev["version"] == "v0001" and prev["verified"] is True

    kept = models / "releases" / r1
    before = ((kept / "model.onnx").stat().st_ino, (kept / "release.json").read_text())
    back = agent_board.run("install-model", "digits", "v0001", f"model.onnx={a}")
    assert back.code == 0 and back.last["changed"] is True, back.err
    assert back.last["current"]["version"] == "v0001" and back.last["previous"]["version"] == "v0002"
    assert ((kept / "model.onnx").stat().st_ino, (kept / "release.json").read_text()) == before
    assert (models / "current.onnx").read_bytes() == v1 and hook_log.read_text() == "v0002\nv0001\n"

    missing = hashlib.sha256(b"never uploaded").hexdigest()
    res = agent_board.run("install-model", "digits", "v0003", f"model.onnx={missing}")
    assert res.code == ExitCode.ARTIFACT_INVALID and missing in res.last["error"], res.err
    lying = hashlib.sha256(b"what the name says").hexdigest()
    (root / "blobs" / lying).write_bytes(b"something else")
    res = agent_board.run("install-model", "digits", "v0004", f"model.onnx={lying}")
    assert res.code == ExitCode.BLOB_MISMATCH, res.err
    for bad in (["../x", "v0005", f"model.onnx={a}"], ["digits", "5", f"model.onnx={a}"],
                ["digits", "v0005", "model.onnx=../../etc/passwd"], ["digits", "v0005", a],
                ["digits", "v0005", f"weights.bin={a}"], ["digits", "v0005", f"model.int8.onnx={c}"]):  # fmt: skip
        res = agent_board.run("install-model", *bad)
        assert res.code == ExitCode.INVALID_ARGUMENT and res.last["cause"] == "INVALID_ARGUMENT", (
            bad,
            res.err,
        )
    assert agent_board.run("models", "../x").code == ExitCode.INVALID_ARGUMENT
    assert (
        os.readlink(models / "current") == f"releases/{r1}" and (models / "current.onnx").read_bytes() == v1
    )
    assert os.readlink(models / "previous") == f"releases/{r2}"
    assert ((kept / "model.onnx").stat().st_ino, (kept / "release.json").read_text()) == before
    assert sorted(p.name for p in (models / "releases").iterdir()) == [r1, r2]  # no staging left
    assert hook_log.read_text() == "v0002\nv0001\n"  # failed installs change nothing

    (models / "releases" / r2 / "model.int8.onnx").unlink()  # a release tampered with
    answer = agent_board.run("models", "digits")
    assert answer.code == 0, answer.err
    assert answer.last["current"]["verified"] is True and answer.last["previous"]["verified"] is False


@pytest.mark.slow
def test_one_job_trains_at_a_time(agent_board, digits_job):
    done_spec, files = digits_job("earlier", epochs=1)
    done = agent_board.run("run", str(agent_board.install(done_spec, files)))
    assert done.code == 0, done.err
    first, _ = digits_job("first", epochs=12)  # held at step 2 until it is cancelled
    second, _ = digits_job("second", epochs=1)
    jdir1, jdir2 = agent_board.install(first, files), agent_board.install(second, files)
    agent_board.hold("first", 2)  # training through every check below, however loaded the machine
    res = agent_board.run("start", str(jdir1))
    assert res.code == 0 and res.last["state"] == "running", res.err
    assert agent_board.held_at("first") == 2

    for cmd in ("start", "run"):
        busy = agent_board.run(cmd, str(jdir2))
        assert busy.code == ExitCode.BOARD_BUSY and busy.last["cause"] == "BOARD_BUSY", (cmd, busy.err)
        assert "first" in busy.last["error"] and busy.last["job_id"] == "second"
    assert agent_board.run("status", str(jdir2)).last["state"] == "pending"
    again = agent_board.run("run", str(agent_board.job_dir("earlier")))  # a stored result: no lock needed
    assert again.code == 0 and again.last == done.last, again.err

    running = agent_board.run("jobs", "--running")
    assert running.code == 0, running.err
    assert running.last["training"] == "first"
    assert [(j["job_id"], j["state"]) for j in running.last["jobs"]] == [("first", "running")]
    everything = agent_board.run("jobs").last
    assert [j["job_id"] for j in everything["jobs"]][0] == "first"
    assert {j["job_id"]: j["state"] for j in everything["jobs"]} == {
        "first": "running",
        "second": "pending",
        "earlier": "finished",
    }

    assert agent_board.run("cancel", str(jdir1)).code == 0
    status = agent_board.wait("first", lambda s: s["state"] != "running")
    assert status["state"] == "cancelled", status
    res = agent_board.run("start", str(jdir2))
    assert res.code == 0, res.err
    status = agent_board.wait("second", lambda s: s["state"] != "running")
    assert status["state"] == "finished" and status["exit_code"] == 0, status
    idle = agent_board.run("jobs", "--running").last
    assert idle["jobs"] == [] and idle["training"] is None
