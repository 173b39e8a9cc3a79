"""Pull mode runs on the board as the rest of the agent does: in the torch-free board venv (numpy and
onnxruntime only: no torch, prefect, cryptography or host code), ``enrol`` and a check-in work against
a local HTTPS endpoint, and importing the commands loads neither numpy nor onnxruntime."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from device_agent.protocol import ExitCode
from tasks.paths import PROJECT_ROOT
from tests.agent import pull_kit
from tests.agent.pull_kit import BOARD, Endpoint

endpoint = pull_kit.endpoint  # the kit's fixture

HEAVY = ("torch", "prefect", "fabric", "paramiko", "tasks", "flows", "cryptography", "starlette")
SCRIPT = """
import json, sys
import device_agent.cli
light = [m for m in ("numpy", "onnxruntime") if m in sys.modules]
from device_agent.pull import client, commands, config, contract, identity, jobs, service, transfer
code = device_agent.cli.main(["--root", sys.argv[1], "pull", "--once"])
heavy = sorted(m for m in json.loads(sys.argv[2]) if sys.modules.get(m))  # torch: None, blocked
print(json.dumps({"code": code, "light_loaded": light, "heavy": heavy}))
"""


def test_enrol_and_a_check_in_in_the_torch_free_board_venv(
    board_python: Path, tmp_path: Path, endpoint: Endpoint
) -> None:
    env = {"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin"}
    root = tmp_path / "board"
    enrol = subprocess.run(
        [str(board_python), "-m", "device_agent", "--root", str(root), "enrol", "--endpoint", endpoint.url,
         "--pin", endpoint.pin, "--name", BOARD],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert enrol.returncode == 0, enrol.stderr
    assert json.loads(enrol.stdout.splitlines()[-1])["state"] == "accepted"
    run = subprocess.run([str(board_python), "-c", SCRIPT, str(root), json.dumps(HEAVY)], capture_output=True, text=True, env=env,
                         timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    verdict = json.loads(run.stdout.splitlines()[-1])
    assert verdict == {"code": ExitCode.OK, "light_loaded": [], "heavy": []}
    assert endpoint.routes() == ["enrol", "poll"] and all(s.verified for s in endpoint.seen)
