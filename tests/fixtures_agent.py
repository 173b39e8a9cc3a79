"""Session fixtures of the agent area: the board venv and helpers to lay out and run agent jobs.

``board_python`` is a venv with only numpy + onnxruntime-training-cpu (no torch, no prefect);
``AgentBoard`` is an agent root (``blobs/``, ``jobs/``) in a tmp dir with a ``run`` helper that
executes ``python -m device_agent`` in that venv exactly as on a board.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from device_agent.protocol import JobSpec
from tasks.paths import PROJECT_ROOT


@dataclass
class AgentRun:
    """One agent invocation: exit code, JSON lines of stdout, stderr."""

    code: int
    out: list[dict[str, Any]]
    err: str

    @property
    def last(self) -> dict[str, Any]:
        return self.out[-1] if self.out else {}


def _text(path: Path) -> str:
    """The stripped text of ``path``; "" when there is none."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


@dataclass
class AgentBoard:
    """An agent root on this machine, driven through the board venv's python."""

    python: Path
    root: Path

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id

    def install(self, spec: JobSpec, files: dict[str, Path]) -> Path:
        """Copy blobs (content-addressed) and write job.json; returns the job folder."""
        blobs = self.root / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        for sha, path in files.items():
            if not (blobs / sha).exists():
                shutil.copyfile(path, blobs / sha)
        jdir = self.job_dir(spec.job_id)
        jdir.mkdir(parents=True, exist_ok=True)
        (jdir / "job.json").write_text(spec.to_json())
        return jdir

    def write_raw(self, job_id: str, spec: dict[str, Any]) -> Path:
        """Write an arbitrary (possibly invalid) job.json dict."""
        jdir = self.job_dir(job_id)
        jdir.mkdir(parents=True, exist_ok=True)
        (jdir / "job.json").write_text(json.dumps(spec))
        return jdir

    def hold(self, job_id: str, at_step: int) -> None:
        """Make the job pause once it has trained ``at_step`` steps (the agent's hold hook,
        ``JOBDIR/hold``) until :meth:`release`: a test then acts on a job that is still training,
        however loaded the machine."""
        (self.job_dir(job_id) / "hold").write_text(str(at_step))

    def held_at(self, job_id: str) -> int:
        """The step a job started for the first time paused at (``JOBDIR/held``), once it has;
        fails when the job wrote its result without pausing."""
        jdir = self.job_dir(job_id)
        while not (text := _text(jdir / "held")):  # created, then written: read a step
            assert not (jdir / "result.json").exists(), f"job {job_id} ended without pausing"
            time.sleep(0.05)
        return int(text)

    def release(self, job_id: str) -> None:
        """Let the job go on, and a later run of it not pause (removes ``JOBDIR/hold``, and the
        ``held`` a killed job left)."""
        for name in ("hold", "held"):
            (self.job_dir(job_id) / name).unlink(missing_ok=True)

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> AgentRun:
        """``python -m device_agent --root ROOT ARGS`` in the board venv."""
        full_env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **(env or {})}
        for key in ("ODL_AGENT_STEP_DELAY_S",):
            if env is None or key not in env:
                full_env.pop(key, None)
        proc = subprocess.run(
            [str(self.python), "-m", "device_agent", "--root", str(self.root), *args],
            capture_output=True, text=True, env=full_env, timeout=timeout, cwd=str(self.root),
        )  # fmt: skip
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        return AgentRun(proc.returncode, lines, proc.stderr)

    def wait(self, job_id: str, pred: Any, timeout: float = 120) -> dict[str, Any]:
        """Poll ``status`` until ``pred(status)`` is true; returns that status."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.run("status", str(self.job_dir(job_id))).last
            if pred(status):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting on job {job_id}: {status}")
            time.sleep(0.1)


@pytest.fixture(scope="session")
def board_python() -> Path:
    """Python of the torch-free board venv (built once, reused across sessions): numpy +
    onnxruntime-training-cpu; on a host without onnxruntime-training (no wheel for Python >= 3.12)
    numpy + the newest plain onnxruntime of deploy/board-requirements-plain.txt, which trains
    autograd jobs (the tests of ORT-training jobs are skipped there: tests/conftest.py)."""
    from tasks.board.check_items import PLAIN_REQUIREMENTS, pins
    from tasks.recipe.host_runtime import why_no_ort_training
    from tasks.vboard.venv import ensure_board_venv
    from tests.fixtures_board import BOARD_VENV  # shared with the virtual board

    if why_no_ort_training() is None:
        return ensure_board_venv(BOARD_VENV)
    plain = pins(PLAIN_REQUIREMENTS)
    wanted = (f"numpy=={plain['numpy'][0]}", f"onnxruntime=={plain['onnxruntime'][-1]}")
    return ensure_board_venv(BOARD_VENV.with_name(BOARD_VENV.name + "-plain"), wanted)


@pytest.fixture
def agent_board(board_python: Path, tmp_path: Path) -> AgentBoard:
    """A fresh agent root for one test."""
    root = tmp_path / "odl"
    (root / "blobs").mkdir(parents=True)
    return AgentBoard(board_python, root)


@pytest.fixture(scope="session")
def digits_job(digits_recipe, prepared_digits):
    """A factory: ``digits_job(job_id, **train_overrides) -> (JobSpec, files)`` from odl prepare."""
    from tasks.prepare.board_job import build_job_spec

    def make(job_id: str, **train: Any) -> tuple[JobSpec, dict[str, Path]]:
        spec, files = build_job_spec(digits_recipe, prepared_digits, job_id)
        return replace(spec, train=replace(spec.train, **train)), files

    return make


@pytest.fixture(scope="session")
def crash_job(tmp_path_factory):
    """A factory: ``crash_job(job_id, **train_overrides) -> (JobSpec, files)`` of the recipe whose loss
    divides by its integer count of positive labels (tests/prepare/crash_kit.py, autograd runtime, 2
    epochs of 4 steps), prepared and validated on data whose every batch holds one, sent to train on
    a board dataset whose 7th step's batch holds none: ONNX Runtime dies there of SIGFPE."""
    import runpy

    from device_agent.protocol import BlobRef, DataRef, file_sha256
    from tasks.prepare.board_job import build_job_spec
    from tasks.prepare.pipeline import prepare
    from tests.prepare.crash_kit import crash_recipe
    from tests.prepare.kit import tiny_recipe

    folder = tmp_path_factory.mktemp("counted")
    recipe = tiny_recipe(folder, crash_recipe(folder, {"training": {"epochs": 2, "runtime": "autograd"}}))
    prepared = prepare(recipe, folder / "out")
    (folder / "board").mkdir()
    runpy.run_path(str(folder / "crashmodels.py"))["make_empty_board_batch"](folder / "board")
    data = folder / "board" / "train.npz"
    ref = DataRef("npz", blob=BlobRef(file_sha256(data), data.stat().st_size))

    def make(job_id: str, **train: Any) -> tuple[JobSpec, dict[str, Path]]:
        spec, files = build_job_spec(recipe, prepared, job_id)
        return replace(spec, train_data=ref, train=replace(spec.train, **train)), {
            **files,
            ref.blob.sha256: data,
        }

    return make
