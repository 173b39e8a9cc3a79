"""End to end (issue 45), faults and limits of simulated worker hosts: every process of a host
SIGKILLed while its group's boards train (the group runs again elsewhere, the boards' jobs are
reattached, the round completes), and one job per board across hosts (the server's board slot)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.hosts import run_fleet
from tasks.paths import PROJECT_ROOT
from tests.fixtures_hosts import odl_hosts

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.board]


def _kill_host(netns: str) -> int:
    """SIGKILL every process in the network namespace ``netns`` (a host's worker and its flow runs)."""
    import signal

    target = os.stat(f"/run/netns/{netns}").st_ino
    killed = 0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.stat(proc / "ns" / "net").st_ino == target:
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


def _started_jobs(board: str) -> list[str]:
    """The jobs on a virtual board that wrote their "started" event (read as root, locally)."""
    from tasks.board.inventory import get_board

    root = Path(get_board(board).root)
    return sorted(p.parent.name for p in root.glob("jobs/*/events.jsonl") if '"started"' in p.read_text())


def test_a_host_killed_mid_round_loses_nothing(hosts_lab, monkeypatch):
    """h2's every process is SIGKILLed while its group's boards train: the fleet run marks that group
    run Crashed once its heartbeats stop, starts the group again (h1 takes it), the boards' jobs
    that were running are reattached, not run twice, and the round completes with all four."""
    import threading
    import time

    from tasks.hosts import lifecycle
    from tests.fixtures_board import odl_home_env

    env, home = hosts_lab, Path(hosts_lab["ODL_HOME"])
    up = odl_hosts(env, "up", "--hosts", "2", ODL_BOARD_LEASE_S="60")
    assert up.returncode == 0, up.stderr[-2000:]
    hosts = {h["name"]: h for h in lifecycle.status()}
    monkeypatch.setenv("ODL_GROUP_STALE_S", "70")
    with odl_home_env(home):
        before = {b: _started_jobs(b) for b in ("hb0", "hb1", "hb2", "hb3")}
    seen: dict[str, list[str]] = {}
    since = time.time()

    def killer() -> None:  # the first group run h2 takes: kill h2 once one of its boards trains
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with odl_home_env(home):
                fresh = {b: sorted(set(_started_jobs(b)) - set(before[b])) for b in before}
            mine = [b for b, jobs in fresh.items() if jobs and _group_host(home, b, since) == "h2"]
            if mine:
                seen.update({b: fresh[b] for b in mine})
                seen["killed"] = [str(_kill_host(hosts["h2"]["netns"]))]
                return
            time.sleep(0.5)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        summary = run_fleet(env, rounds=1, epochs=4, fanout=2, deadline_s=400)
    finally:
        thread.join(timeout=5)
        odl_hosts(env, "down")
    assert int(seen.get("killed", ["0"])[0]) >= 2, seen  # the worker and its flow run at least
    (record,) = summary["rounds"]
    assert record["took_part"] == ["hb0", "hb1", "hb2", "hb3"]
    lost = [g for g in record["groups"] if g.get("lost")]
    assert len(lost) == 1 and "no heartbeat" in lost[0]["lost"]
    again = [g for g in record["groups"] if g["boards"] == lost[0]["boards"] and not g.get("lost")]
    assert len(again) == 1 and again[0]["state"] == "Completed" and again[0]["host"] == "h1"
    assert any(b in seen for b in lost[0]["boards"])  # h2 was killed while its boards trained
    for board in (b for b in lost[0]["boards"] if b in seen):  # its job went on: reattached, not rerun
        with odl_home_env(home):
            assert sorted(set(_started_jobs(board)) - set(before[board])) == seen[board]
        assert record["boards"][board]["job_id"] == seen[board][0]


def _group_host(home: Path, board: str, since: float) -> str | None:
    """Which host runs the group of ``board`` (its folder ``round-001-<first board>``, made since
    ``since``): h1, h2, or None before a host took it."""
    first = "hb0" if board in ("hb0", "hb1") else "hb2"
    for host in ("h1", "h2"):
        if any(
            p.stat().st_mtime >= since
            for p in (home / "hosts" / host).glob(f"fleet-groups/*/round-001-{first}")
        ):
            return host
    return None


def test_one_job_per_board_holds_across_hosts(hosts_lab):
    """Two group runs of the same board at once (two fleet runs' ids), one on each host (each under
    a 0.5 CPU quota): the board's slot on the server lets one job train at a time, so their jobs on
    the board never overlap."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks import stages
    from tasks.board.inventory import get_board
    from tasks.checkpoint import checkpoint_weights
    from tasks.fleet.fanout import GROUP_DEPLOYMENT, RESULT_TYPE, pack_weights
    from tasks.hosts import lifecycle
    from tasks.recipe.load import load_recipe
    from tasks.vboard.cgroup import cgroup_dir
    from tests.fixtures_board import odl_home_env

    env, home = hosts_lab, Path(hosts_lab["ODL_HOME"])
    up = odl_hosts(env, "up", "--hosts", "2", "--cpu-quota", "0.5")
    assert up.returncode == 0, up.stderr[-2000:]
    recipe_path = PROJECT_ROOT / "recipes" / "digits_fleet.toml"
    with odl_home_env(home):
        groups = [cgroup_dir(name, "cpu", "host") for name in ("h1", "h2")]
        assert {h["name"]: h["cpu_quota_now"] for h in lifecycle.status()} == {"h1": 0.5, "h2": 0.5}
        for h, g in zip(lifecycle.status(), groups, strict=True):  # each worker under its host's quota
            assert str(h["pid"]) in (g / "cgroup.procs").read_text().split()
        prep = stages.prepare(stages.inputs(load_recipe(recipe_path)), validate_recipe=False)
        weights = pack_weights(checkpoint_weights(prep.checkpoint, trainable_only=True))
        root = Path(get_board("hb0").root)
    params = {"recipe": str(recipe_path), "overrides": {"training.epochs": 2}, "boards": ["hb0"], "round": 1,
              "deadline_wall": time.time() + 400, "weights": weights}  # fmt: skip
    try:
        with (
            temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}),
            get_client(sync_client=True) as client,
        ):
            ids = [
                run_deployment(GROUP_DEPLOYMENT, parameters={"params": {**params, "run_id": f"excl{i}"}}, timeout=0).id
                for i in (1, 2)
            ]  # fmt: skip
            deadline, runs = time.monotonic() + 400, []
            while time.monotonic() < deadline:
                runs = [client.read_flow_run(i) for i in ids]
                if all(r.state and r.state.is_final() for r in runs):
                    break
                time.sleep(1)
            assert all(r.state.is_completed() for r in runs), [r.state for r in runs]
            jobs = []
            for i in ids:
                flt = ArtifactFilter(
                    flow_run_id=ArtifactFilterFlowRunId(any_=[i]), type=ArtifactFilterType(any_=[RESULT_TYPE])
                )
                (art,) = client.read_artifacts(artifact_filter=flt)
                (item,) = json.loads(art.data) if isinstance(art.data, str) else art.data
                assert "npz" in item, item
                jobs.append((item["host"], item["job_id"]))
    finally:
        odl_hosts(env, "down")
    assert not any(g.exists() for g in groups)  # down removed the hosts' cgroups
    assert sorted(h for h, _ in jobs) == ["h1", "h2"] and jobs[0][1] != jobs[1][1]
    spans = []
    for _, job in jobs:
        events = [
            json.loads(line) for line in (root / "jobs" / job / "events.jsonl").read_text().splitlines()
        ]
        started = min(e["ts"] for e in events if e["type"] == "started")
        ended = max(e["ts"] for e in events if e["type"] == "finished")
        spans.append((started, ended))
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0, f"two jobs on board hb0 at once: {spans}"
