"""Cancel, NaN stop, memory guard and BUSY, each with its exit code and message."""

from __future__ import annotations

import re
from dataclasses import replace

from device_agent.job.checkpoints import latest_checkpoint
from device_agent.job.events import read_events
from device_agent.protocol import ExitCode


def test_cancel_saves_checkpoint_then_start_resumes(agent_board, digits_job):
    spec, files = digits_job("cancelme", epochs=4)
    jdir = agent_board.install(spec, files)
    agent_board.hold("cancelme", 3)  # still training when busy and cancel come, however loaded the machine
    started = agent_board.run("start", str(jdir))
    assert started.code == 0, started.err
    assert agent_board.held_at("cancelme") == 3
    busy = agent_board.run("start", str(jdir))
    assert busy.code == ExitCode.BUSY and "already running" in busy.last["error"]
    cancel = agent_board.run("cancel", str(jdir))
    assert cancel.code == 0 and cancel.last["state"] == "cancelling"
    status = agent_board.wait("cancelme", lambda s: s["state"] != "running")
    assert status["state"] == "cancelled" and status["exit_code"] == ExitCode.CANCELLED
    stopped_at = status["step"]
    assert 3 <= stopped_at < 4 * 13
    ckpt = latest_checkpoint(jdir / "checkpoints")
    assert ckpt is not None and int(ckpt.name.split("-")[1]) == stopped_at
    assert read_events(jdir / "events.jsonl")[-1]["type"] == "cancelled"

    agent_board.release("cancelme")
    again = agent_board.run("run", str(jdir))
    assert again.code == 0 and again.last["status"] == "finished" and again.last["steps"] == 4 * 13
    starts = [e["data"] for e in read_events(jdir / "events.jsonl") if e["type"] == "started"]
    assert starts[-1]["resumed_from_step"] == stopped_at


def test_nan_loss_fails_with_step_and_keeps_last_good_checkpoint(agent_board, digits_job):
    spec, files = digits_job("diverge", epochs=3, lr=1e30, checkpoint_every=1)
    jdir = agent_board.install(spec, files)
    run = agent_board.run("run", str(jdir))
    assert run.code == ExitCode.DIVERGED, run.err
    res = run.last
    assert res["status"] == "failed" and "loss became" in res["error"]
    failed_step = int(res["error"].split("at step ")[1].split()[0])
    assert failed_step == res["steps"] + 1 >= 2
    ckpt = latest_checkpoint(jdir / "checkpoints")
    assert ckpt is not None and int(ckpt.name.split("-")[1]) == res["steps"]
    assert not (jdir / "inference.onnx").exists()
    failed = [e for e in read_events(jdir / "events.jsonl") if e["type"] == "failed"]
    assert failed and failed[-1]["data"]["exit_code"] == ExitCode.DIVERGED
    again = agent_board.run("run", str(jdir))  # never retried: the stored failure comes back
    assert again.code == ExitCode.DIVERGED and again.last == res


def test_memory_guard_refuses_to_start(agent_board, digits_job):
    """A job whose estimate exceeds the RAM the kernel lets the agent have (MemAvailable, or a cgroup
    limit's headroom: tests/board/test_vboard_limits.py runs it under a real cap) never starts."""
    spec, files = digits_job("bigjob")
    spec = replace(spec, memory_estimate_mb=10_000_000.0)  # 10 TB: more than any host has
    jdir = agent_board.install(spec, files)
    run = agent_board.run("run", str(jdir))
    assert run.code == ExitCode.NO_MEMORY
    match = re.fullmatch(r"free RAM (\d+) MB is below the job's estimate 10000000 MB", run.last["error"])
    assert match, run.last["error"]
    info = agent_board.run("info")
    assert info.code == 0, info.err
    seen, avail = float(match.group(1)), info.last["mem_available_mb"]
    assert 0 < seen <= info.last["mem_total_mb"] and abs(seen - avail) < max(256.0, 0.2 * avail)
    assert not (jdir / "checkpoints").exists()
    fits = replace(spec, job_id="smalljob", memory_estimate_mb=min(64.0, avail / 2))
    ok = agent_board.run("run", str(agent_board.install(fits, files)))
    assert ok.code == 0 and ok.last["status"] == "finished", ok.err
