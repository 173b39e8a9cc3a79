"""End to end (issue 45): two simulated worker hosts (``odl hosts up --hosts 2``: own network
namespace, own ODL_HOME, one worker each on odl-pool) and a fleet round over four virtual boards
fanned out as two ``odl/fleet-group`` runs; the Prefect server says which host's worker ran each,
and the aggregate equals the one-host aggregation of the very updates the boards sent."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.hosts import GROUP, fleet_lab, run_fleet
from tasks.paths import PROJECT_ROOT
from tests.e2e.prefect_api import post

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.board]
SECRET = "store-pw-never-shown"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0:
        pytest.skip("simulated hosts and virtual boards need root (ip netns, useradd, sshd)")
    with fleet_lab(tmp_path_factory.mktemp("hosts") / "odl", 4, 0.25) as env:
        yield env


def _odl(env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    run_env = {**os.environ, "ODL_HOME": env["ODL_HOME"], "PYTHONPATH": str(PROJECT_ROOT), **extra}
    return subprocess.run([sys.executable, "-m", "flows.cli", "hosts", *args], env=run_env,
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_two_hosts_each_run_a_group_and_the_aggregate_is_the_one_host_one(lab, tmp_path: Path):
    from tasks.hosts import lifecycle

    env, home = lab, Path(lab["ODL_HOME"])
    secret = tmp_path / "store.pw"
    secret.write_text(SECRET)
    store = {"ODL_STORE_URL": "postgresql://odl@10.0.0.5/odl", "ODL_STORE_PASSWORD_FILE": str(secret)}
    up = _odl(env, "up", "--hosts", "2", **store)
    assert up.returncode == 0, up.stderr[-2000:]
    assert SECRET not in up.stdout + up.stderr
    hosts = {h["name"]: h for h in lifecycle.status()}
    assert sorted(hosts) == ["h1", "h2"] and all(h["running"] for h in hosts.values())
    spaces = {_netns(h["pid"]) for h in hosts.values()}  # each worker: a namespace of its own
    assert len(spaces) == 2 and _netns(os.getpid()) not in spaces
    for h in hosts.values():  # its own home, the store passed on, no database URL
        environ = dict(
            kv.split("=", 1) for kv in Path(f"/proc/{h['pid']}/environ").read_text().split("\0") if "=" in kv
        )
        assert environ["ODL_HOME"] == h["home"] and environ["ODL_STORE_URL"] == store["ODL_STORE_URL"]
        assert Path(environ["ODL_STORE_PASSWORD_FILE"]).parent == Path(h["home"])
        assert not any(k.endswith("DATABASE_CONNECTION_URL") for k in environ)
        assert h["boards"] == ["hb0", "hb1", "hb2", "hb3"]

    summary = run_fleet(env, rounds=1, epochs=1, fanout=2)
    (record,) = summary["rounds"]
    assert record["took_part"] == ["hb0", "hb1", "hb2", "hb3"]
    groups = record["groups"]
    assert [g["boards"] for g in groups] in (
        [["hb0", "hb1"], ["hb2", "hb3"]],
        [["hb2", "hb3"], ["hb0", "hb1"]],
    )

    # which worker ran each group run: the server's own events
    ran = {}
    for g in groups:
        body = {"filter": {"related": {"id": [f"prefect.flow-run.{g['flow_run_id']}"]},
                           "event": {"name": ["prefect.worker.submitted-flow-run"]}}, "limit": 5}  # fmt: skip
        (event,) = post(env, "/events/filter", body)["events"]
        ran[g["flow_run_id"]] = event["resource"]["prefect.resource.name"]
        assert ran[g["flow_run_id"]] == hosts[g["host"]]["worker"]  # the host it says it was
    assert sorted(ran.values()) == sorted(h["worker"] for h in hosts.values())  # both hosts ran one

    # the one-host aggregation of the updates as the boards sent them (the files in the hosts' homes)
    fleet_dir = next(home.glob(f"fleet/digits_fleet-{GROUP}-*"))
    originals = {}
    for g in groups:
        for board in g["boards"]:
            (path,) = Path(hosts[g["host"]]["home"]).glob(f"fleet-groups/*/round-001-*/{board}/trainable.npz")
            received = fleet_dir / "round-001" / board / "trainable.npz"
            assert (
                hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(received.read_bytes()).digest()
            )
            originals[board] = path
    fanned, local, start = _aggregate_both_ways(home, record, originals)
    assert sorted(fanned) == sorted(local)
    assert all(np.array_equal(fanned[k], local[k]) and fanned[k].dtype == local[k].dtype for k in fanned)
    assert any(not np.array_equal(fanned[k], start[k]) for k in fanned)  # the round did change them

    down = _odl(env, "down")
    assert down.stdout.strip() == "stopped: h1, h2"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(h["netns"] not in names for h in hosts.values())
    assert not any(_alive(h["pid"]) for h in hosts.values())


def _aggregate_both_ways(home: Path, record: dict, originals: dict[str, Path]) -> tuple[dict, dict, dict]:
    """(the fanned-out run's aggregate, a fresh one-host FleetRun's aggregate of ``originals`` from
    the same start, the start weights)."""
    from tasks import stages
    from tasks.board.inventory import get_group
    from tasks.checkpoint import checkpoint_weights
    from tasks.fleet.board_round import BoardUpdate
    from tasks.fleet.rounds import FleetRun
    from tasks.recipe.load import load_recipe
    from tests.fixtures_board import odl_home_env

    fleet_dir = next(home.glob(f"fleet/digits_fleet-{GROUP}-*"))
    with odl_home_env(home):
        recipe = load_recipe(PROJECT_ROOT / "recipes" / "digits_fleet.toml", {"training.epochs": 1})
        inp = stages.inputs(recipe)
        prep = stages.prepared(inp)
        one = FleetRun.start_run(inp, prep, GROUP, get_group(GROUP), "one-host-check")
        start = dict(one.weights)
        results = {}
        for name, row in record["boards"].items():
            keep = {k: row[k] for k in ("job_id", "samples", "metrics", "bytes_down", "bytes_up",
                                        "seconds", "train_s", "files")}  # fmt: skip
            results[name] = BoardUpdate(board=name, update=originals[name], **keep)
        one.close_round(1, results)
        fanned = checkpoint_weights(fleet_dir / "round-001" / "aggregate.ckpt", trainable_only=True)
    return fanned, one.weights, start


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


def test_a_host_killed_mid_round_loses_nothing(lab, monkeypatch):
    """h2's every process is SIGKILLed while its group's boards train: the fleet run marks that group
    run Crashed once its heartbeats stop, starts the group again (h1 takes it), the boards' jobs
    that were running are reattached, not run twice, and the round completes with all four."""
    import threading
    import time

    from tasks.hosts import lifecycle
    from tests.fixtures_board import odl_home_env

    env, home = lab, Path(lab["ODL_HOME"])
    up = _odl(env, "up", "--hosts", "2", ODL_BOARD_LEASE_S="60")
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
        _odl(env, "down")
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


def test_one_job_per_board_holds_across_hosts(lab):
    """Two group runs of the same board at once (two fleet runs' ids), one on each host: the board's
    slot on the server lets one job train at a time, so their jobs on the board never overlap."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks import stages
    from tasks.board.inventory import get_board
    from tasks.checkpoint import checkpoint_weights
    from tasks.fleet.fanout import GROUP_DEPLOYMENT, RESULT_TYPE, pack_weights
    from tasks.recipe.load import load_recipe
    from tests.fixtures_board import odl_home_env

    env, home = lab, Path(lab["ODL_HOME"])
    up = _odl(env, "up", "--hosts", "2")
    assert up.returncode == 0, up.stderr[-2000:]
    recipe_path = PROJECT_ROOT / "recipes" / "digits_fleet.toml"
    with odl_home_env(home):
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
        _odl(env, "down")
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
