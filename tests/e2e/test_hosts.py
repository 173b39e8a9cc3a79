"""End to end (issue 45): two simulated worker hosts (``odl hosts up --hosts 2``: own network
namespace, own ODL_HOME, one worker each on odl-pool) and a fleet round over four virtual boards
fanned out as two ``odl/fleet-group`` runs, measured as bench/hosts.py measures it; the Prefect
server says which host's worker ran each, and the aggregate equals the one-host aggregation of the very updates the boards sent; the hosts
fetch the recipe's prepared folder from the store instead of preparing it. Every host,
the first included, is configured for one real shared store (tests/fixtures_store.py's cluster,
which the hosts reach at this machine's end of their veths). A host SIGKILLed mid-fetch catches up
with the store when it comes back, before its worker takes work."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench.hosts import GROUP, measure
from tasks.paths import PROJECT_ROOT
from tests.bench.test_bench import positive
from tests.e2e.prefect_api import post
from tests.fixtures_hosts import host_environ, kill_host, odl_hosts
from tests.fixtures_store import store_password

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.board]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_two_hosts_each_run_a_group_and_the_aggregate_is_the_one_host_one(hosts_lab, shared_store):
    from tasks.hosts import lifecycle
    from tasks.store import Documents, configured_store

    env, home = hosts_lab, Path(hosts_lab["ODL_HOME"])
    store, secret = shared_store, store_password(shared_store)  # this process's store: up's too
    up = odl_hosts(env, "up", "--hosts", "2")
    assert up.returncode == 0, up.stderr[-2000:]
    assert secret not in up.stdout + up.stderr
    hosts = {h["name"]: h for h in lifecycle.status()}
    assert sorted(hosts) == ["h1", "h2"] and all(h["running"] for h in hosts.values())
    spaces = {_netns(h["pid"]) for h in hosts.values()}  # each worker: a namespace of its own
    assert len(spaces) == 2 and _netns(os.getpid()) not in spaces
    for h in hosts.values():  # its own home, the store passed on (at its veth's end), no database URL
        environ = dict(
            kv.split("=", 1) for kv in Path(f"/proc/{h['pid']}/environ").read_text().split("\0") if "=" in kv
        )
        url = store["ODL_STORE_URL"].replace("@127.0.0.1:", f"@{h['host_ip']}:")
        assert environ["ODL_HOME"] == h["home"] and environ["ODL_STORE_URL"] == url
        assert Path(environ["ODL_STORE_PASSWORD_FILE"]).parent == Path(h["home"])
        assert not any(k.endswith("DATABASE_CONNECTION_URL") for k in environ)
        assert h["boards"] == ["hb0", "hb1", "hb2", "hb3"]

    # the round as bench/hosts.py --quick measures it (the hosts kept: no warm-up, each prepares or
    # fetches inside the round): every figure measured and both hosts used
    row, summary = measure(env, 2, 4, 1, 1, None, warm_up=False)
    assert {h["name"]: h["pid"] for h in lifecycle.status()} == {n: h["pid"] for n, h in hosts.items()}
    assert (row["hosts"], row["boards"], row["boards_ok"], row["hosts_used"]) == (2, 4, 4, 2)
    positive(row, "round_s", "hosts_cpu_per_board_s", "first_host_cpu_per_board_s", "link_bytes_per_round",
             "server_payload_bytes_per_round", "board_bytes_per_round")  # fmt: skip
    # what crosses the hosts' links includes every board's update and the weights each group got
    assert row["link_bytes_per_round"] > row["board_bytes_per_round"] and 0 < row["accuracy"] <= 1
    (record,) = summary["rounds"]
    assert record["took_part"] == ["hb0", "hb1", "hb2", "hb3"]
    groups = record["groups"]
    assert [g["boards"] for g in groups] in (
        [["hb0", "hb1"], ["hb2", "hb3"]],
        [["hb2", "hb3"], ["hb0", "hb1"]],
    )

    # the hosts read the store: their inventory is its document (the first home's, pushed at its first
    # read), no longer the copy `up` made with the key paths rewritten into their homes
    shared = Documents(configured_store()).get("inventory.toml").content
    assert shared == (home / "inventory.toml").read_bytes()
    assert all((Path(h["home"]) / "inventory.toml").read_bytes() == shared for h in hosts.values())

    # the hosts did not prepare the recipe: they fetched the first home's folder from the store, byte
    # for byte (validation.json holds the preparing host's own timings)
    (prepared,) = home.glob("prepared/digits_fleet-*")
    for h in hosts.values():
        theirs = Path(h["home"]) / "prepared" / prepared.name
        assert (theirs / "validation.json").read_bytes() == (prepared / "validation.json").read_bytes()
        assert (theirs / "model.onnx").read_bytes() == (prepared / "model.onnx").read_bytes()

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

    down = odl_hosts(env, "down")
    assert down.stdout.strip() == "stopped: h1, h2"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(h["netns"] not in names for h in hosts.values())
    assert not any(_alive(h["pid"]) for h in hosts.values())


def test_a_host_killed_mid_fetch_catches_up_when_it_comes_back(hosts_lab, shared_store, tmp_path):
    """h1 is SIGKILLed (every process of its namespace) while it fetches a 64 MB version from the
    store; meanwhile the first home records and promotes another and adds a group. ``odl hosts up``
    starts h1 again and, before its worker, catches it up as itself: the killed fetch's temporary
    file is gone, the current version is in its cache whole, its inventory is the store's; ``odl
    hosts sync`` then finds nothing left to do."""
    from tasks.board.inventory import save_group
    from tasks.hosts import lifecycle
    from tasks.judge.registry_open import open_registry
    from tasks.store import Documents, configured_store
    from tests.fixtures_board import odl_home_env
    from tests.store.kit import model_file, verdict

    env, home = hosts_lab, Path(hosts_lab["ODL_HOME"])
    assert odl_hosts(env, "up", "--hosts", "1").returncode == 0
    (h1,) = lifecycle.status()
    assert h1["caught_up"]["store"] and h1["caught_up"]["fetched"] == []  # nothing recorded yet
    with odl_home_env(home):
        reg = open_registry()
        big = model_file(tmp_path / "a", os.urandom(64 << 20), "model.onnx")
        first = reg.record("digits_fleet", "hb0", big, {"accuracy": 0.5}, verdict(True))
    cache = Path(h1["home"]) / h1["caught_up"]["cache"] / "digits_fleet-hb0"
    code = "from tasks.judge.registry_open import open_registry as o; o().current('digits_fleet', 'hb0').path"
    fetch = subprocess.Popen(["ip", "netns", "exec", h1["netns"], sys.executable, "-c", code], cwd=PROJECT_ROOT,
                             env={**host_environ(h1["pid"]), "PYTHONPATH": str(PROJECT_ROOT)})  # fmt: skip
    deadline = time.monotonic() + 120
    while not list((cache / first.name).glob(".model.onnx.*")):  # the blob's temporary file: mid-fetch
        assert fetch.poll() is None and time.monotonic() < deadline, "h1's fetch ended before the kill"
        time.sleep(0.01)
    assert kill_host(h1["netns"]) >= 2  # the worker and the fetch
    fetch.wait(timeout=30)
    left = list((cache / first.name).glob(".model.onnx.*"))
    assert left and not (cache / first.name / "model.onnx").exists()

    with odl_home_env(home):  # while h1 is down
        second = reg.record("digits_fleet", "hb0", model_file(tmp_path / "b", b"v2" * 999, "model.onnx"),
                            {"accuracy": 0.6}, verdict(True, 0.6))  # fmt: skip
        save_group("late", ["hb1"])
    assert odl_hosts(env, "up", "--hosts", "1").returncode == 0
    (back,) = lifecycle.status()
    assert back["running"] and back["pid"] != h1["pid"]
    caught = back["caught_up"]
    assert caught["fetched"] == [f"digits_fleet/hb0 {second.name}"]
    assert [Path(r).name for r in caught["removed"]] == [p.name for p in left]
    assert not list(cache.rglob(".model.onnx.*"))
    assert (cache / second.name / "model.onnx").read_bytes() == b"v2" * 999
    inventory = (Path(back["home"]) / "inventory.toml").read_bytes()
    assert inventory == Documents(configured_store()).get("inventory.toml").content and b"late" in inventory
    synced = odl_hosts(env, "sync")
    assert synced.returncode == 0 and synced.stdout.strip().endswith("fetched nothing; 0 leftover(s) removed")


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


def test_a_server_beyond_loopback_refuses_a_request_without_its_credential(hosts_lab):
    """The lab's server listens on 0.0.0.0: the API takes Prefect's basic auth (the credential made
    once, 0600, in the first home), a request without it is refused 401, one with it answered; a
    host's worker gets the client's credential, never the server's setting."""
    import base64
    import stat
    import urllib.error
    import urllib.request

    api = hosts_lab["PREFECT_API_URL"]
    cred_file = Path(hosts_lab["ODL_HOME"]) / "prefect" / "api-auth"
    assert stat.S_IMODE(cred_file.stat().st_mode) == 0o600
    assert hosts_lab["PREFECT_API_AUTH_STRING"] == cred_file.read_text().strip()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(
            urllib.request.Request(api + "/flows/filter", data=b"{}", method="POST"), timeout=5
        )
    assert refused.value.code == 401
    good = base64.b64encode(hosts_lab["PREFECT_API_AUTH_STRING"].encode()).decode()
    req = urllib.request.Request(api + "/flows/filter", data=b"{}", method="POST",
                                 headers={"Authorization": f"Basic {good}", "Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
    from tasks.hosts.lifecycle import host_env

    worker = host_env(hosts_lab, Path(hosts_lab["ODL_HOME"]) / "hosts" / "x", api)
    assert worker["PREFECT_API_AUTH_STRING"] and "PREFECT_SERVER_API_AUTH_STRING" not in worker
