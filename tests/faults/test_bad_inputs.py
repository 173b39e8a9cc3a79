"""Bad-input catalogue at the host/board boundary, each with its message and exit code, none leaving
partial state. Covered elsewhere (referenced, not copied): every wrong recipe field
(tests/recipe/test_recipe.py::test_bad_field_is_named), corrupt/truncated artifacts on the board
(tests/agent/test_bad_inputs.py::test_corrupt_and_missing_artifacts), artifacts of a newer onnx IR
or opset (tests/prepare/test_artifacts.py::test_refuses_what_the_board_cannot_load), the agent's
dataset checks (tests/agent/test_bad_inputs.py::test_dataset_mismatch, whose table is reused here
for the host's check), unsafe job ids (tests/e2e/test_deploy.py), a changed or unknown host key
(tests/e2e/test_transport_ssh.py)."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from device_agent.protocol import PROTOCOL_VERSION, ExitCode
from tasks.board import agent, jobs, run
from tasks.board.inventory import Board
from tasks.board.transport import LocalTransport, connect
from tasks.errors import DataError, DeviceIncompatible, HostExit, TrainingFailed
from tasks.vboard.venv import make_readable
from tests.agent.test_bad_inputs import DATA_CASES


@pytest.mark.parametrize(("arrays", "text"), DATA_CASES, ids=[c[1][:30] for c in DATA_CASES])
def test_host_refuses_bad_training_data_before_upload(digits_recipe, prepared_digits, tmp_path, arrays, text):
    """Validation's check (the board's own) and the check before any step is built (the exported
    model only, its class count read from the graph when the recipe gives none) both refuse."""
    from tasks.prepare.validation.data_checks import check_data, check_data_against_model

    bad = tmp_path / "train.npz"
    np.savez(bad, **arrays)
    recipe = dataclasses.replace(digits_recipe, data=dataclasses.replace(digits_recipe.data, train=bad))
    unnamed = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, num_classes=None))
    for check in (
        lambda: check_data(recipe, prepared_digits.manifest, prepared_digits.out_dir),
        lambda: check_data_against_model(unnamed, prepared_digits.out_dir / "model.onnx"),
    ):
        with pytest.raises(DataError) as info:
            check()
        assert str(info.value).startswith(f"data.train ({bad}): ")
        assert info.value.exit_code == HostExit.DATA


def test_unknown_board_is_named_with_its_exit_code(tmp_path: Path) -> None:
    from tasks.paths import PROJECT_ROOT

    env = os.environ | {"ODL_HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "flows.cli", "run", "recipes/digits.toml", "--board", "nosuchboard"]
    proc = subprocess.run(argv, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == HostExit.BOARD, proc.stderr
    assert "nosuchboard" in proc.stderr and "odl: error:" in proc.stderr
    assert not (tmp_path / "prepared").exists() and not (tmp_path / "runs").exists()


def test_diverging_lr_fails_for_good_and_keeps_the_last_good_checkpoint(
    local_board: Board, digits_job
) -> None:
    conn = LocalTransport()
    spec, files = digits_job("diverging", epochs=3, lr=1e30, checkpoint_every=1)
    for _ in range(2):  # a second drive_job does not train again: DIVERGED is never retried
        with pytest.raises(TrainingFailed, match=f"failed \\(exit {int(ExitCode.DIVERGED)}\\)") as info:
            run.drive_job(conn, local_board, spec, files)
        assert not info.value.retryable
    result = jobs.read_result(conn, local_board, spec.job_id)
    assert result.status == "failed" and result.exit_code == ExitCode.DIVERGED
    jdir = Path(jobs.job_dir(local_board, spec.job_id))
    assert [p.name for p in (jdir / "checkpoints").iterdir()]  # the last good checkpoint is kept
    assert not (jdir / "inference.onnx").exists()
    starts = [line for line in (jdir / "events.jsonl").read_text().splitlines() if '"started"' in line]
    assert len(starts) == 1


@pytest.fixture
def fresh_root_board(virtual_board: Board) -> Board:
    """The virtual board with an empty agent root of its own (removed afterwards)."""
    root = posixpath.join(posixpath.dirname(virtual_board.root), f"odl-bad-{os.getpid()}")
    board = dataclasses.replace(virtual_board, root=root)
    yield board
    conn = connect(board)
    try:
        conn.run(["rm", "-rf", root])
    finally:
        conn.close()


def _numpy_only_python(board_python: Path, where: Path) -> str:
    """A venv with numpy but no onnxruntime (readable by the board user)."""
    subprocess.run([str(board_python), "-m", "venv", "--without-pip", str(where)], check=True)
    site = next(where.glob("lib/python3*/site-packages"))
    src = next(board_python.parent.parent.glob("lib/python3*/site-packages"))
    for name in os.listdir(src):
        if name.startswith("numpy"):
            os.symlink(src / name, site / name)
    make_readable(where)  # whatever this run's umask (CI's is 077)
    return str(where / "bin" / "python")


@pytest.mark.board
@pytest.mark.parametrize("problem", ["protocol", "training-api"])
def test_incompatible_board_is_refused_before_anything_is_uploaded(
    fresh_root_board: Board, board_python: Path, digits_job, problem: str
) -> None:
    board = fresh_root_board
    spec, files = digits_job(f"incompat-{problem}")
    conn = connect(board)
    try:
        if problem == "protocol":  # an agent from another release: same files but PROTOCOL_VERSION 99
            agent.install_agent(conn, board)
            proto = posixpath.join(board.root, "agent", "device_agent", "wire.py")  # PROTOCOL_VERSION's home
            conn.run(
                ["sed", "-i", f"s/^PROTOCOL_VERSION = {PROTOCOL_VERSION}$/PROTOCOL_VERSION = 99/", proto]
            )
            want = f"agent protocol 99, host speaks {PROTOCOL_VERSION}"
        else:
            venv = Path(f"/var/tmp/odl-faults-numpy-only-{os.getpid()}")
            board = dataclasses.replace(board, python=_numpy_only_python(board_python, venv))
            want = "without the training API"
        with pytest.raises(DeviceIncompatible, match=want) as info:
            run.drive_job(conn, board, spec, files)
        assert info.value.exit_code == HostExit.INCOMPATIBLE and not info.value.retryable
        assert conn.run(["ls", "-A", board.root]).stdout.split() == ["agent"]  # no blobs/, no jobs/
    finally:
        conn.close()
        if problem != "protocol":
            subprocess.run(["rm", "-rf", str(venv)], check=False)


@pytest.mark.parametrize(
    ("task", "dims", "classes"),
    [
        ("classification", ["n", 7], 7),
        ("segmentation", ["n", 5, 8, 8], 5),
        ("segmentation", ["n", "c", 8, 8], None),  # a symbolic channel count bounds nothing
        ("classification", ["n"], None),
    ],
)
def test_the_class_count_is_read_from_the_graph_per_task(tmp_path, task, dims, classes):
    """A classifier's classes are its output's last dimension, a segmentation model's its channels."""
    import onnx
    from onnx import TensorProto, helper

    from tasks.prepare.validation.data_checks import graph_classes

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph), tmp_path / "model.onnx")
    assert graph_classes(tmp_path / "model.onnx", task) == classes
    assert graph_classes(tmp_path / "model.onnx", task, "y") == classes
