"""Bad job specs, corrupt or missing blobs and datasets that do not fit the model."""

from __future__ import annotations

import copy
import hashlib
import shutil
from dataclasses import replace

import numpy as np
import pytest

from device_agent.protocol import PROTOCOL_VERSION, BlobRef, DataRef, ExitCode

SHA0 = "0" * 64


def _set(d: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for key in parents:
        d = d[key]
    if value is KeyError:
        del d[last]
    else:
        d[last] = value


SPEC_CASES = [  # (path in job.json, new value or KeyError to delete, code, text in the message)
    ("job_id", "other", ExitCode.INVALID_SPEC, "field 'job_id'"),
    ("job_id", "../x", ExitCode.INVALID_SPEC, "job_id: '../x' is not a valid name"),
    (
        "protocol_version",
        99,
        ExitCode.PROTOCOL_MISMATCH,
        f"field 'protocol_version': expected protocol version {PROTOCOL_VERSION} (got 99)",
    ),
    (
        "protocol_version",
        KeyError,
        ExitCode.PROTOCOL_MISMATCH,
        "field 'protocol_version': expected an integer",
    ),
    ("artifacts.checkpoint", KeyError, ExitCode.INVALID_SPEC, "field 'artifacts.checkpoint'"),
    (
        "artifacts.eval_model.sha256",
        "xyz",
        ExitCode.INVALID_SPEC,
        "artifacts.eval_model.sha256': expected 64",
    ),
    ("artifacts.eval_model.size", -1, ExitCode.INVALID_SPEC, "artifacts.eval_model.size"),
    ("train.batch_size", 0, ExitCode.INVALID_SPEC, "field 'train.batch_size': expected an integer >= 1"),
    ("train.epochs", "3", ExitCode.INVALID_SPEC, "field 'train.epochs': expected int"),
    ("train.lr", -1.0, ExitCode.INVALID_SPEC, "field 'train.lr': expected a finite number > 0"),
    ("train.final_lr_ratio", 2.0, ExitCode.INVALID_SPEC, "train.final_lr_ratio"),
    ("train.log_every", 0, ExitCode.INVALID_SPEC, "train.log_every"),
    ("train.momentum", 0.9, ExitCode.INVALID_SPEC, "field 'train.momentum': expected no such field"),
    ("task", "captioning", ExitCode.INVALID_SPEC, "field 'task'"),
    ("output_names", [], ExitCode.INVALID_SPEC, "field 'output_names'"),
    ("feeds", {"input": 3}, ExitCode.INVALID_SPEC, "field 'feeds'"),
    ("train_data.format", "csv", ExitCode.INVALID_SPEC, "field 'train_data.format'"),
    ("train_data.path", "/data/x.npz", ExitCode.INVALID_SPEC, "exactly one of 'blob' or 'path'"),
    ("memory_estimate_mb", -5, ExitCode.INVALID_SPEC, "field 'memory_estimate_mb'"),
    ("num_classes", -1, ExitCode.INVALID_SPEC, "field 'num_classes'"),
    ("extra", 1, ExitCode.INVALID_SPEC, "field 'extra': expected no such field"),
]


@pytest.mark.parametrize(
    ("path", "value", "code", "text"), SPEC_CASES, ids=[c[0] + "=" + repr(c[1]) for c in SPEC_CASES]
)
def test_bad_job_spec(agent_board, digits_job, path, value, code, text):
    spec, files = digits_job("badspec")
    raw = copy.deepcopy(spec.to_dict())
    _set(raw, path, value)
    jdir = agent_board.write_raw("badspec", raw)
    for command in ("validate", "run", "start"):
        run = agent_board.run(command, str(jdir))
        assert run.code == code, (command, run.out, run.err)
        assert text in run.last["error"], run.last
    assert not (jdir / "result.json").exists()


def test_invalid_json_and_missing_job(agent_board):
    jdir = agent_board.job_dir("broken")
    jdir.mkdir(parents=True)
    (jdir / "job.json").write_text("{not json")
    run = agent_board.run("validate", str(jdir))
    assert run.code == ExitCode.INVALID_SPEC and "valid JSON" in run.last["error"]
    gone = agent_board.run("run", str(agent_board.job_dir("nope")))
    assert gone.code == ExitCode.JOB_NOT_FOUND


def test_job_of_protocol_1_is_a_version_mismatch(agent_board, digits_job):
    spec, _ = digits_job("oldjob")
    raw = spec.to_dict()
    del raw["protocol_version"]
    raw["protocol"] = 1  # how protocol 1 spelled the version in job.json
    jdir = agent_board.write_raw("oldjob", raw)
    for command in ("validate", "start"):
        run = agent_board.run(command, str(jdir))
        assert run.code == ExitCode.PROTOCOL_MISMATCH, (command, run.out, run.err)
        assert (
            f"'protocol_version': expected protocol version {PROTOCOL_VERSION} (got 1)" in run.last["error"]
        )


def test_corrupt_and_missing_artifacts(agent_board, digits_job):
    spec, files = digits_job("corrupt")
    jdir = agent_board.install(spec, files)
    blob = agent_board.root / "blobs" / spec.artifacts["training_model"].sha256
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    for command in ("validate", "run"):
        run = agent_board.run(command, str(jdir))
        assert run.code == ExitCode.ARTIFACT_INVALID, run.err
        assert "artifacts.training_model: sha256 mismatch" in run.last["error"]
    blob.unlink()
    run = agent_board.run("run", str(jdir))
    assert (
        run.code == ExitCode.ARTIFACT_INVALID
        and "blob" in run.last["error"]
        and "missing" in run.last["error"]
    )
    shutil.copyfile(files[spec.artifacts["training_model"].sha256], blob)  # fixed upload: retried
    run = agent_board.run("run", str(jdir))
    assert run.code == 0 and run.last["status"] == "finished", run.err


def _data_blob(agent_board, arrays: dict[str, np.ndarray], tmp_path) -> DataRef:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    shutil.copyfile(path, agent_board.root / "blobs" / sha)
    return DataRef("npz", blob=BlobRef(sha, path.stat().st_size))


def _digits(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.random((n, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)


def _nan_x() -> np.ndarray:
    x = _digits()[0]
    x[3, 0, 2, 2] = np.nan
    return x


DATA_CASES = [  # (arrays, text in the message)
    ({"x": _digits()[0][:, :, :7, :7], "y": _digits()[1]}, "expected shape (N, 1, 8, 8), got (64, 1, 7, 7)"),
    ({"x": _digits()[0][:, 0], "y": _digits()[1]}, "expected 4 dims (N, 1, 8, 8), got shape (64, 8, 8)"),
    ({"x": _digits()[0], "y": _digits()[1] + 5}, "labels must be in [0, 9] (model has 10 classes)"),
    ({"x": _digits()[0], "y": -_digits()[1] - 1}, "labels must be in [0, 9]"),
    ({"x": _digits()[0], "y": _digits()[1][:10]}, "10 rows, other inputs have 64"),
    ({"x": _digits()[0], "y": _digits()[1].astype(np.float32)}, "expected dtype int64, got float32"),
    ({"x": _nan_x(), "y": _digits()[1]}, "contains NaN or inf"),
    ({"images": _digits()[0], "y": _digits()[1]}, "npz has no array 'x' for model input"),
]


@pytest.mark.parametrize(("arrays", "text"), DATA_CASES, ids=[c[1][:30] for c in DATA_CASES])
def test_dataset_mismatch(agent_board, digits_job, tmp_path, arrays, text):
    spec, files = digits_job("baddata")
    spec = replace(spec, train_data=_data_blob(agent_board, arrays, tmp_path))
    jdir = agent_board.install(spec, files)
    check = agent_board.run("validate", str(jdir))
    assert check.code == ExitCode.DATA_MISMATCH and text in check.last["error"], (check.out, check.err)
    assert not (jdir / "result.json").exists() and not (jdir / "events.jsonl").exists()
    run = agent_board.run("run", str(jdir))
    assert run.code == ExitCode.DATA_MISMATCH, (run.out, run.err)
    assert text in run.last["error"] and "train_data" in run.last["error"], run.last["error"]
    assert run.last["status"] == "failed" and run.last["steps"] == 0
