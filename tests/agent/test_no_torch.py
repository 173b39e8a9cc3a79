"""The agent runs in a venv with only numpy + onnxruntime-training-cpu, on odl-prepare artifacts."""

from __future__ import annotations

import json
import subprocess

import pytest

from device_agent.protocol import PROTOCOL_VERSION, BoardInfo
from tasks.paths import PROJECT_ROOT

SCRIPT = """
import json, sys
from pathlib import Path
from device_agent.cli import main
code = main(["--root", sys.argv[1], "run", sys.argv[2]])
bad = sorted(m for m in ("torch", "prefect", "fabric", "paramiko", "tasks", "flows") if sys.modules.get(m))
print(json.dumps({"code": code, "heavy_modules": bad}))
"""


def test_board_venv_has_no_torch(board_python):
    proc = subprocess.run([str(board_python), "-c", "import torch"], capture_output=True, text=True)
    assert proc.returncode != 0 and "No module named 'torch'" in proc.stderr


@pytest.mark.ort_training  # the board venv of onnxruntime-training-cpu (a plain one where the host has none)
def test_info_reports_versions_and_training_api(agent_board):
    run = agent_board.run("info")
    assert run.code == 0, run.err
    info = BoardInfo.from_dict(run.last)
    assert info.to_dict() == run.last  # the typed answer holds every field the agent sent
    assert info.training_api is True and info.ort_version == "1.19.2"
    assert info.protocol_version == PROTOCOL_VERSION and info.mem_available_mb > 0 and info.disk_free_mb > 0
    assert info.torch_loaded is False and info.cpu_count >= 1


def test_run_prepared_digits_without_torch_or_prefect(agent_board, digits_job):
    spec, files = digits_job("notorch", epochs=2)
    jdir = agent_board.install(spec, files)
    check = agent_board.run("validate", str(jdir))
    assert check.code == 0, check.err
    assert (
        check.last["ok"] is True and check.last["train_samples"] == 400 and check.last["eval_samples"] == 100
    )
    assert check.last["inputs"]["input"] == ["N", 1, 8, 8] and check.last["num_classes"] == 10
    proc = subprocess.run(
        [str(agent_board.python), "-c", SCRIPT, str(agent_board.root), str(jdir)],
        capture_output=True, text=True, env={"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    verdict = json.loads(lines[-1])
    assert verdict == {"code": 0, "heavy_modules": []}
    result = json.loads(lines[-2])
    assert result["status"] == "finished" and result["steps"] == spec.train.epochs * 13
    assert (jdir / "inference.onnx").is_file() and (jdir / "checkpoints" / "final").is_file()
