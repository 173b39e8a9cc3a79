"""Out of memory for real: a job whose true peak exceeds the RAM the kernel lets it use is killed by
the kernel, and the agent reports it as such (exit OUT_OF_MEMORY, peak, estimate and cap, last
checkpoint kept) instead of leaving it to be resumed and killed again.

The job runs under a memory cgroup made for the test (v1 ``memory.limit_in_bytes``, or v2
``memory.max``), so this needs root and a writable memory controller; the job is the digits recipe
with one huge batch (a step's activations alone exceed the cap), after one small checkpointed epoch.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from device_agent.protocol import NEVER_RETRY, DataRef, ExitCode

CAP_MB = 300


def _memory_cgroup(name: str) -> Path | None:
    for root, limit in (
        (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
        (Path("/sys/fs/cgroup"), "memory.max"),
    ):
        if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
            if limit == "memory.max" and "memory" not in (root / "cgroup.subtree_control").read_text():
                continue
            cg = root / name
            with contextlib.suppress(FileExistsError):
                cg.mkdir()
            (cg / limit).write_text(f"{CAP_MB * 2**20}\n")
            for swap in ("memory.memsw.limit_in_bytes", "memory.swap.max"):
                with contextlib.suppress(OSError):
                    (cg / swap).write_text(f"{CAP_MB * 2**20}\n" if "memsw" in swap else "0\n")
            return cg
    return None


@pytest.fixture
def capped():
    if os.geteuid() != 0:
        pytest.skip("a memory cgroup needs root")
    cg = _memory_cgroup(f"odl-oomtest-{os.getpid()}")
    if cg is None:
        pytest.skip("no writable memory cgroup controller")
    yield cg
    for _ in range(50):
        with contextlib.suppress(OSError):
            cg.rmdir()
            return
        time.sleep(0.1)


def _big_batch_data(src: Path, root: Path, rows: int) -> DataRef:
    from device_agent.protocol import BlobRef, file_sha256

    with np.load(src) as d:
        x, y = d["x"], d["y"]
    reps = -(-rows // len(x))
    tmp = root / "big.npz"
    np.savez(tmp, x=np.concatenate([x] * reps)[:rows], y=np.concatenate([y] * reps)[:rows])
    sha = file_sha256(tmp)
    os.replace(tmp, root / "blobs" / sha)
    return DataRef("npz", blob=BlobRef(sha, (root / "blobs" / sha).stat().st_size))


def test_kernel_kill_is_reported_as_out_of_memory_and_not_restarted(
    agent_board, digits_job, digits_recipe, capped
):
    spec, files = digits_job("oom", epochs=1, batch_size=32768, checkpoint_every=1)
    data = _big_batch_data(digits_recipe.data.train, agent_board.root, 32768)
    spec = replace(spec, train_data=data, memory_estimate_mb=50.0)  # an estimate that was wrong
    jdir = agent_board.install(spec, files)
    argv = [
        str(agent_board.python),
        "-m",
        "device_agent",
        "--root",
        str(agent_board.root),
        "start",
        str(jdir),
    ]
    enter = f'echo $$ > {capped / "cgroup.procs"} && exec "$@"'
    started = subprocess.run(["sh", "-c", enter, "sh", *argv], capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    status = agent_board.wait("oom", lambda s: s["state"] != "running", timeout=180)
    assert status["state"] == "failed" and status["exit_code"] == ExitCode.OUT_OF_MEMORY, status
    assert ExitCode.OUT_OF_MEMORY in NEVER_RETRY
    assert agent_board.run("start", str(jdir)).code == 0  # asked again: its stored outcome stays
    status = agent_board.wait("oom", lambda s: s["state"] != "running", timeout=60)
    assert status["state"] == "failed" and status["exit_code"] == ExitCode.OUT_OF_MEMORY, status
    result = agent_board.run("run", str(jdir)).last
    assert result["exit_code"] == ExitCode.OUT_OF_MEMORY and result["steps"] == 0
    assert "out of memory: the kernel killed the job" in result["error"], result["error"]
    assert f"the board lets it use {CAP_MB} MB" in result["error"] and "estimate was 50 MB" in result["error"]
    assert "no checkpoint yet" in result["error"]
    assert result["peak_rss_mb"] > CAP_MB * 0.5
