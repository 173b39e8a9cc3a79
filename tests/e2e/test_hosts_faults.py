"""End to end (issue 45), faults and limits of simulated worker hosts: every process of a host
SIGKILLed while its group's boards train (the group runs again elsewhere, the boards' jobs are
reattached, the round completes), one job per board across hosts (the server's board slot), and a
host cut off from the store in the middle of recording a version (one line, exit 72, nothing lands;
a rerun once the link is back records it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.hosts import run_fleet
from tasks.paths import PROJECT_ROOT
from tests.fixtures_hosts import host_environ, kill_host, odl_hosts
from tests.fixtures_store import store_password

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.board]


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
                seen["killed"] = [str(kill_host(hosts["h2"]["netns"]))]
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
    from prefect.settings import temporary_settings

    from tasks import stages
    from tasks.board.inventory import get_board
    from tasks.checkpoint import checkpoint_weights
    from tasks.fleet.fanout import GROUP_DEPLOYMENT, RESULT_TYPE, pack_weights
    from tasks.hosts import lifecycle
    from tasks.recipe.load import load_recipe
    from tasks.stack.server import api_settings
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
    params = {"recipe": str(recipe_path), "overrides": {"training.epochs": 1}, "boards": ["hb0"], "round": 1,
              "deadline_wall": time.time() + 400, "weights": weights}  # fmt: skip
    try:
        with (
            temporary_settings(updates=api_settings(env)),
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


def _cut(netns: str, ip: str, port: int, cut: bool) -> None:
    """Drop (``cut``) or let through again every packet between the host in ``netns`` and ``ip:port``."""
    chains = (f"chain out {{ type filter hook output priority 0; ip daddr {ip} tcp dport {port} drop; }}\n"
              f"chain in {{ type filter hook input priority 0; ip saddr {ip} tcp sport {port} drop; }}\n")  # fmt: skip
    rules = f"table inet odl_cut {{\n{chains}}}\n" if cut else "delete table inet odl_cut\n"
    subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=rules, text=True, check=True)


def _store_rows(store, sql: str) -> list[tuple]:
    with store.transaction() as conn:
        return conn.execute(sql).fetchall()


def test_a_host_cut_off_from_the_store_mid_record_fails_in_one_line_and_lands_nothing(
    hosts_lab, shared_store
):
    """h1 runs ``odl flow`` (in its namespace, with its worker's environment); the test holds a lock
    on the versions table, so h1's record waits inside its transaction (blobs committed, version row
    sent); h1's link to the store is cut there, the lock let go. The run fails within
    ODL_STORE_TIMEOUT_S with exit 72 and one line naming the store as h1 reaches it, no password; the
    store holds no version, entry or history row and only whole blobs; the server rolled h1's
    transaction back (its session gone). A command on the cut host is refused the same way; with the
    link back the same command records v0001."""
    import psycopg

    from tasks.hosts import lifecycle
    from tasks.store import configured_store

    env, secret = hosts_lab, store_password(shared_store)
    up = odl_hosts(env, "up", "--hosts", "1")
    assert up.returncode == 0, up.stderr[-2000:]
    (h1,) = lifecycle.status()
    environ = host_environ(h1["pid"])
    host_env = {**environ, "ODL_STORE_TIMEOUT_S": "3", "PYTHONPATH": str(PROJECT_ROOT)}
    address = environ["ODL_STORE_URL"]  # as h1 reaches it: this machine's end of its veth
    port = int(address.rsplit(":", 1)[1].split("/")[0])
    flow = ["ip", "netns", "exec", h1["netns"], sys.executable, "-m", "flows.cli", "flow", "recipes/digits_fleet.toml",
            "--board", "hb0", "--epochs", "1", "--set", "promotion.rollout=false"]  # fmt: skip
    store = configured_store()
    store.check()  # the tables exist before the lock is taken
    holder = psycopg.connect(**store.cfg.connect_kwargs())
    try:
        holder.execute("LOCK TABLE odl_registry_versions IN SHARE MODE")  # until holder's commit
        run = subprocess.Popen(flow, env=host_env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline, waiting, t0 = time.monotonic() + 400, [], 0.0
        while not waiting and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            waiting = _store_rows(store, "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                                  "query LIKE 'INSERT INTO odl_registry_versions%'")  # fmt: skip
        assert waiting, run.communicate(timeout=60)[1][-3000:]
        _cut(h1["netns"], h1["host_ip"], port, True)
        t0 = time.monotonic()
    finally:
        holder.commit()
        holder.close()
    try:
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()  # nothing left running after a failure (its namespace goes with the host)
    assert run.returncode == 72, err[-3000:]
    assert time.monotonic() - t0 < 30  # the host's keepalives, not the kernel's 15 min of retransmissions
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"odl: error: ODL_STORE_URL={address}: lost the store ("), err[-3000:]
    assert last.endswith("nothing of this transaction was committed, run again"), last
    assert "Traceback" not in err and secret not in out + err

    deadline = time.monotonic() + 30  # the server rolls h1's transaction back once it sat idle 3 s
    while _store_rows(store, f"SELECT pid FROM pg_stat_activity WHERE pid = {waiting[0][0]}"):
        assert time.monotonic() < deadline, "h1's session still holds its transaction"
        time.sleep(0.5)
    for table in (
        "odl_registry_entries",
        "odl_registry_versions",
        "odl_registry_history",
        "odl_registry_files",
    ):
        assert _store_rows(store, f"SELECT count(*) FROM {table}") == [(0,)], table
    torn = _store_rows(store, "SELECT b.sha256 FROM odl_blobs b FULL JOIN (SELECT sha256, count(*) n, "
                       "sum(length(data)) s FROM odl_blob_chunks GROUP BY sha256) c ON c.sha256 = b.sha256 "
                       "WHERE b.chunks IS DISTINCT FROM c.n OR b.size IS DISTINCT FROM c.s")  # fmt: skip
    assert torn == [] and _store_rows(store, "SELECT count(*) FROM odl_blobs")[0][0] >= 1  # put whole, before

    t0 = time.monotonic()
    cmd = flow[:4] + [sys.executable, "-m", "flows.cli", "registry", "digits_fleet", "hb0"]
    refused = subprocess.run(cmd, env=host_env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 72 and time.monotonic() - t0 < 30, refused.stderr[-2000:]
    assert refused.stderr.startswith(f"odl: error: ODL_STORE_URL={address}: the store cannot be reached (")
    assert refused.stderr.endswith("timeout expired)\n") and refused.stderr.count("\n") == 1, refused.stderr

    _cut(h1["netns"], h1["host_ip"], port, False)
    again = subprocess.run(flow, env=host_env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _store_rows(store, "SELECT number FROM odl_registry_versions") == [(1,)]
