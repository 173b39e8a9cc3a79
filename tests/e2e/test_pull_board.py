"""A board that can only dial out, end to end: a virtual pull board in its namespace behind a NAT
router (inbound dropped), enrolled with a one-time code, promoted by ``odl/full`` through the real
Prefect stack; then the ways such a link fails: a board rebooted mid-training, a board offline
past its job's deadline, a revoked board. One NAT'd lab for the module (as the hosts tests share
theirs), in the session's board home, so the session's Prefect stack runs its flows."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.paths import PROJECT_ROOT
from tests.e2e.prefect_api import post as api
from tests.fixtures_board import odl_home_env

pytestmark = [pytest.mark.slow, pytest.mark.board]
NAME = "nat1"  # the tutorial's name (docs/tutorials/pull-board.md)


@pytest.fixture(scope="module")
def pull_board(virtual_board_home: Path):
    """The NAT'd pull board of the session's home, made as the tutorial makes it (``odl board up
    --name nat1 --pull``: its endpoint at the lab gateway); board, endpoint and gateway gone after."""
    from tasks.stack.endpoint import stop
    from tasks.vboard.lifecycle import board_down
    from tasks.vboard.natnet import remove_gateway

    if os.geteuid() != 0:
        pytest.skip("a NAT'd virtual board needs root (ip netns, nftables, useradd)")
    env = {**os.environ, "ODL_HOME": str(virtual_board_home)}
    try:
        up = _odl(env, "board", "up", "--name", NAME, "--pull", timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"board {NAME} up behind NAT" in up.stdout, up.stdout
        yield NAME
    finally:
        with odl_home_env(virtual_board_home):
            board_down(NAME, purge=True)
            stop(virtual_board_home)
            remove_gateway()


def _odl(env: dict[str, str], *args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "odl"), *args], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _state(home: Path) -> dict:
    return json.loads((home / "boards" / NAME / "state.json").read_text())


def test_nothing_reaches_the_board_from_outside(pull_board, virtual_board_home):
    """The board has a private address behind its router; a connection to the router is dropped."""
    state = _state(virtual_board_home)
    started = time.monotonic()
    with pytest.raises(OSError):
        socket.create_connection((state["router_ip"], 22), timeout=2)
    assert time.monotonic() - started >= 1.9  # dropped (a timeout), not refused
    assert state["host"] == "192.168.7.2" and "sshd.pid" not in os.listdir(
        virtual_board_home / "boards" / NAME
    )


def test_odl_full_promotes_through_pull_mode(prefect_stack, pull_board, virtual_board_home):
    """`odl watch odl/full` (prefect deployment run odl/full) on the NAT'd board, whose service is
    down when the run starts (a board offline): the run says in its log that it waits for the board
    to check in; once the service is back the run completes with a verdict, the board's events reach
    it, and the boards overview says how the board is reached."""
    from tasks.vboard import pullboard

    bdir = virtual_board_home / "boards" / NAME
    pullboard.stop_service(bdir)
    params = json.dumps({"board": NAME, "epochs": 3})
    watch = subprocess.Popen([str(Path(sys.executable).parent / "odl"), "watch", "odl/full", "--params", params,
                              "--timeout", "360"], env=prefect_stack, cwd=PROJECT_ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    time.sleep(20)  # the run starts, prepares and waits for the board
    pullboard.start_service(bdir, _state(virtual_board_home))
    out, _ = watch.communicate(timeout=400)
    done = subprocess.CompletedProcess(watch.args, watch.returncode, out, "")
    assert done.returncode == 0, out[-3000:]
    assert any(line.startswith("Promoted: v") for line in out.splitlines()), out[-2000:]
    assert re.search(r"training: step \d+/\d+", out), out[-2000:]
    run_id = re.search(r"/runs/flow-run/([0-9a-f-]{36})", out).group(1)
    run = api(prefect_stack, "/flow_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})[0]
    assert run["state"]["type"] == "COMPLETED"
    listed = _odl(prefect_stack, "board", "list").stdout
    assert re.search(rf"{NAME}\s+pull \(accepted, last seen \d+ s ago\)", listed), listed
    logs = api(prefect_stack, "/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}}, "limit": 200})
    assert any(re.match(rf"waiting for {NAME} to check in: last seen \d+ (s|min) ago", x["message"]) for x in logs), [
        x["message"][:100] for x in logs]  # fmt: skip
    overview = api(prefect_stack, "/artifacts/filter", {"artifacts": {"key": {"any_": ["odl-boards"]}},
                                                        "sort": "CREATED_DESC", "limit": 1})[0]  # fmt: skip
    row = next(r for r in json.loads(overview["data"]) if r["board"] == NAME)
    assert row["reachable"].startswith("pull, accepted<br>checked in "), row


def test_a_board_rebooted_mid_training_resumes_its_job(pull_board, virtual_board_home):
    """The board's service and its job killed mid-training (a power cut); the service started again
    picks the job up from its last checkpoint and the run ends finished, nothing applied twice."""
    from tasks.vboard import pullboard
    from tasks.vboard.lifecycle import kill_user_processes

    env = {**os.environ, "ODL_HOME": str(virtual_board_home)}
    bdir = virtual_board_home / "boards" / NAME
    state = _state(virtual_board_home)
    slow = state | {"env": {"ODL_AGENT_STEP_DELAY_S": "0.05"}}  # 156 steps: about 8 s of training
    pullboard.stop_service(bdir)
    pullboard.start_service(bdir, slow)
    run = subprocess.Popen([str(Path(sys.executable).parent / "odl"), "run", "recipes/digits.toml", "--board",
                            NAME, "--set", "training.epochs=12", "--set", "training.checkpoint_every=10",
                            "--job-id", "reboot-1"], env=env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)  # fmt: skip
    jobs = Path(state["home"]) / "odl" / "jobs" / "reboot-1"
    deadline = time.monotonic() + 180
    while not (jobs / "checkpoints").is_dir() or not any((jobs / "checkpoints").iterdir()):
        assert time.monotonic() < deadline and run.poll() is None, "the job never checkpointed"
        time.sleep(0.2)
    kill_user_processes(state["user"])  # the power cut: the service and the job's processes
    pullboard.stop_service(bdir)
    pullboard.start_service(bdir, slow)
    out, _ = run.communicate(timeout=300)
    pullboard.stop_service(bdir)
    pullboard.start_service(bdir, state)
    assert run.returncode == 0, out[-3000:]
    assert f"job reboot-1 on {NAME}: finished, 156 steps" in out, out[-2000:]
    events = [json.loads(line) for line in (jobs / "events.jsonl").read_text().splitlines()]
    assert sum(e["type"] == "started" for e in events) == 2  # resumed once, from its checkpoint
    assert ([e for e in events if e["type"] == "started"][1]["data"].get("resumed_from_step") or 0) > 0


def test_a_board_offline_past_its_deadline_ends_the_run_in_one_line(pull_board, virtual_board_home):
    from tasks.board.inventory import get_board, save_board
    from tasks.vboard import pullboard

    bdir = virtual_board_home / "boards" / NAME
    with odl_home_env(virtual_board_home):
        pullboard.stop_service(bdir)
        board = get_board(NAME)
        save_board(board.__class__(**{**board.__dict__, "pull_deadline_h": 0.002}))  # 7.2 s
        try:
            env = {**os.environ, "ODL_HOME": str(virtual_board_home)}
            done = _odl(
                env, "run", "recipes/digits.toml", "--board", NAME, "--job-id", "offline-1", timeout=180
            )
        finally:
            save_board(board)
            pullboard.start_service(bdir, _state(virtual_board_home))
    errors = [line for line in done.stderr.splitlines() if line.startswith("odl: error")]
    assert done.returncode != 0 and len(errors) == 1, done.stdout[-1500:] + done.stderr[-1500:]
    assert f"expired on board {NAME}" in errors[0] and "before the deadline" in errors[0], errors


class _Release:
    """A registry version as ``PullLink.install`` reads it: its release files with their sha256."""

    def __init__(self, name: str, model: Path) -> None:
        import hashlib

        self.name, self.model = name, model
        self.sha = hashlib.sha256(model.read_bytes()).hexdigest()

    def verified_files(self, names: tuple[str, ...]) -> dict[str, tuple[Path, str]]:
        return {"model.onnx": (self.model, self.sha)}


def test_a_link_cut_mid_download_resumes_where_it_stopped(pull_board, virtual_board_home, tmp_path):
    """A 4 MB release on a link shaped to 16 Mbit/s; once 1 MB has arrived the router resets the
    board's connection to the endpoint for 3 s (a link that drops). The board resumes with Range
    from the bytes it has: the release is installed, verified, and the bytes the host sent stay
    within 15 % of the file (a download started again would send more than 125 %)."""
    import threading

    from tasks.board.inventory import get_board
    from tasks.board.pull.link import PullLink

    state = _state(virtual_board_home)
    veth, port = (
        state["veth_host"],
        int(
            json.loads((virtual_board_home / "pull" / "endpoint.json").read_text())["listen"].rsplit(":", 1)[
                1
            ]
        ),
    )
    model = tmp_path / "model.onnx"
    model.write_bytes(os.urandom(4_000_000))
    release = _Release("v9001", model)
    subprocess.run(["tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate", "16mbit", "burst", "32kb",
                    "latency", "200ms"], check=True)  # fmt: skip
    router = ["ip", "netns", "exec", state["router_ns"], "nft"]
    answer: dict = {}
    try:
        with odl_home_env(virtual_board_home):
            link = PullLink(get_board(NAME))
            worker = threading.Thread(target=lambda: answer.update(link.install("cut", release)), daemon=True)
            worker.start()
            blobs = Path(state["home"]) / "odl" / "blobs"
            deadline = time.monotonic() + 120
            while not blobs.is_dir() or not any(
                p.name.startswith(".tmp-" + release.sha) and p.stat().st_size > 1_000_000
                for p in blobs.iterdir()
            ):
                assert time.monotonic() < deadline and worker.is_alive(), "the download never reached 1 MB"
                time.sleep(0.05)
            subprocess.run([*router, "-f", "-"], check=True, text=True, input=(
                "table ip odlcut {\n chain f {\n type filter hook forward priority -10;\n"
                f' iifname "lan" tcp dport {port} reject with tcp reset;\n }}\n}}\n'))  # fmt: skip
            time.sleep(3)
            subprocess.run([*router, "delete", "table", "ip", "odlcut"], check=True)
            worker.join(180)
        sent = subprocess.run(
            ["tc", "-s", "qdisc", "show", "dev", veth], capture_output=True, text=True
        ).stdout
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], capture_output=True)
        subprocess.run([*router, "delete", "table", "ip", "odlcut"], capture_output=True)
    assert answer.get("current", {}).get("version") == "v9001", answer
    log = (virtual_board_home / "boards" / NAME / "pull.log").read_text()
    assert (
        f"blob {release.sha[:12]}: cut at" in log
        and f"blob {release.sha[:12]}: fetched (4000000 bytes" in log
    ), log[-2000:]
    bytes_sent = int(re.search(r"Sent (\d+) bytes", sent).group(1))
    assert bytes_sent < 4_000_000 * 1.15, sent


TUTORIAL = PROJECT_ROOT / "docs" / "tutorials" / "pull-board.md"


def tutorial_block(after: str) -> list[str]:
    """The command lines of the tutorial's first ```bash block after the text ``after``."""
    text = TUTORIAL.read_text()
    block = re.search(r"^```bash\n(.*?)^```", text[text.index(after) :], re.S | re.M).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_tutorials_board_commands_enrol_a_board_and_check_in(pull_board, virtual_board_home):
    """The tutorial's real-board steps, as typed: `odl board enrol`, then on the board (the NAT'd
    namespace, the board's own user, a fresh home holding a copy of device_agent/) the printed
    values in the tutorial's board commands: the board enrols with the one-time code and checks in.
    The systemd unit it installs is verified with systemd-analyze where that exists."""
    import shutil

    env = {**os.environ, "ODL_HOME": str(virtual_board_home)}
    enrol = _odl(env, "board", "enrol", "nat2")
    assert enrol.returncode == 0, enrol.stderr
    printed = dict(re.findall(r"--(endpoint|pin|name|code) (\S+)", enrol.stdout))
    assert set(printed) == {"endpoint", "pin", "name", "code"}, enrol.stdout
    state = _state(virtual_board_home)
    home = Path(state["home"]) / "tutorial"  # a fresh home of the board's user: a board new to ODL
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(PROJECT_ROOT / "device_agent", home / "odl" / "agent" / "device_agent",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    subprocess.run(["chown", "-R", f"{state['user']}:{state['user']}", str(home)], check=True)
    path = f"{Path(state['python']).parent}:/usr/bin:/bin"  # python3: the board's own
    script = "\n".join(["set -e", *tutorial_block("run what `odl board enrol` printed")])
    for key, value in printed.items():
        script = script.replace(f"<{key.upper()}>", value)
    assert "<" not in script, script
    done = subprocess.run(["nsenter", f"--net=/run/netns/{state['netns']}", "runuser", "-u", state["user"],
                           "--", "env", f"HOME={home}", f"PATH={path}", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    shutil.rmtree(home, ignore_errors=True)
    assert done.returncode == 0, (script, done.stdout, done.stderr)
    listed = _odl(env, "board", "list").stdout
    assert re.search(r"nat2\s+pull \(accepted, last seen \d+ s ago\)", listed), listed
    unit = PROJECT_ROOT / "deploy" / "board" / "odl-pull.service"
    assert tutorial_block("install the service")[0].startswith("install -m 644 odl-pull.service")
    if shutil.which("systemd-analyze"):
        checked = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert checked.returncode == 0 and "odl-pull" not in checked.stderr, checked.stderr
    with odl_home_env(virtual_board_home):
        from tasks.board.inventory import remove_board

        remove_board("nat2")


def test_a_revoked_board_is_refused_on_both_sides_in_one_line(pull_board, virtual_board_home):
    """Revoked: the board's next check-in is refused and its service stops with one line; a run on
    it is refused before anything is queued. (Last: the board stays revoked.)"""
    from tasks.vboard import pullboard

    env = {**os.environ, "ODL_HOME": str(virtual_board_home)}
    revoked = _odl(env, "board", "revoke", NAME)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout, revoked.stderr
    bdir = virtual_board_home / "boards" / NAME
    deadline = time.monotonic() + 90
    while pullboard.service_alive(bdir):
        assert time.monotonic() < deadline, "the board's service did not stop once revoked"
        time.sleep(0.5)
    log = (bdir / "pull.log").read_text()
    assert f"board {NAME} is revoked" in log, log[-1500:]
    done = _odl(env, "run", "recipes/digits.toml", "--board", NAME, timeout=180)
    assert done.returncode != 0 and f"board {NAME} is revoked" in done.stderr, done.stderr[-1500:]
