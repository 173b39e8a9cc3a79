"""Faults on the virtual board (real sshd, own netns): the agent SIGKILLed mid-training (simulated
reboot), sshd restarted mid-training, the link cut during upload and download, the board's disk full.
Link cut during training and a killed host process: tests/e2e/test_link_faults.py. Board RAM below the
job's estimate: tests/e2e/test_agent_install.py::test_ram_capped_single_cpu_board_refuses_a_big_job
(host, before upload) and tests/agent/test_stop.py::test_memory_guard_refuses_to_start (agent); a
process past a board's RAM cap killed by the kernel: tests/board/test_vboard_limits.py. The upload cut
also runs over a slow, lossy link (tests/fixtures_board.py::SHAPED_LINK) through the delay proxy."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import pwd
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from device_agent.protocol import Event, ExitCode, file_sha256
from tasks.board import agent, blobs, jobs, run
from tasks.board.follow import FollowStats
from tasks.board.inventory import Board
from tasks.board.retrieve import retrieve
from tasks.board.transport import connect
from tasks.board.transport.ssh import SSHTransport
from tasks.errors import DeviceIncompatible, DeviceUnreachable, TransferError
from tests.e2e.faultkit import Faults, release, wait_for, wait_held
from tests.e2e.test_board_job import assert_events_complete
from tests.fixtures_board import odl_home_env

pytestmark = [pytest.mark.board, pytest.mark.slow]
EPOCHS = 40  # digits: 13 steps per epoch, checkpoints every 5 steps
HOLD_STEP = 26  # the job pauses here (after the checkpoint of step 25) while a fault is injected


def _final_weights(conn, board: Board, job_id: str, tmp: Path) -> dict[str, np.ndarray]:
    from device_agent.ort import load_training_api

    local = tmp / f"{job_id}.ckpt"
    conn.get(posixpath.join(jobs.job_dir(board, job_id), "checkpoints", "final"), local)
    state = load_training_api().CheckpointState.load_checkpoint(str(local))
    return {name: np.array(p.data) for name, p in state.parameters}


def _created_held_job(
    faults: Faults, board: Board, digits_job, job_id: str, at_step: int
) -> tuple[object, dict]:
    """The digits job installed, uploaded and created on the board, asked to pause after ``at_step``
    (the agent's hold hook), not started: ``run.drive_job`` then starts and follows it."""
    spec, files = digits_job(job_id, epochs=EPOCHS, checkpoint_every=5)
    conn = connect(board)
    try:
        agent.install_agent(conn, board)
        blobs.upload_blobs(conn, board, files)
        jobs.create_job(conn, board, spec)
    finally:
        conn.close()
    faults.hold(board, job_id, at_step)
    return spec, files


def _drive(board: Board, spec, files, stats: FollowStats) -> tuple[object, list[Event]]:
    """run.drive_job on a new connection, every event kept."""
    events: list[Event] = []
    conn = connect(board)
    try:
        _, result = run.drive_job(conn, board, spec, files, events.append, stats=stats)
    finally:
        conn.close()
    return result, events


@pytest.fixture(scope="module")
def reference(virtual_board: Board, digits_job, tmp_path_factory) -> tuple[object, dict[str, np.ndarray]]:
    """An uninterrupted run of the same job (its result and final weights)."""
    spec, files = digits_job(f"ref-{os.getpid()}", epochs=EPOCHS, checkpoint_every=5)
    conn = connect(virtual_board)
    try:
        _, result = run.drive_job(conn, virtual_board, spec, files)
        return result, _final_weights(conn, virtual_board, spec.job_id, tmp_path_factory.mktemp("ref"))
    finally:
        conn.close()


def _assert_same_as_reference(board: Board, job_id: str, result, reference, tmp_path: Path) -> None:
    ref_result, ref_weights = reference
    assert result.status == "finished" and result.steps == ref_result.steps == EPOCHS * 13
    assert result.history == ref_result.history
    conn = connect(board)
    try:
        got = _final_weights(conn, board, job_id, tmp_path)
    finally:
        conn.close()
    assert got.keys() == ref_weights.keys()
    for name, want in ref_weights.items():
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-6, err_msg=name)


def test_agent_killed_mid_training_is_resumed_and_ends_like_an_uninterrupted_run(
    virtual_board: Board, digits_job, reference, faults: Faults, tmp_path: Path
) -> None:
    job_id = f"reboot-{os.getpid()}"
    spec, files = _created_held_job(faults, virtual_board, digits_job, job_id, HOLD_STEP)
    stats = FollowStats()

    # as a power cut: no checkpoint, no terminal event, no supervisor left to report the death
    def kill_agent() -> None:
        assert wait_held(virtual_board, job_id) == HOLD_STEP
        conn = connect(virtual_board)
        try:
            raw = conn.read_from(posixpath.join(jobs.job_dir(virtual_board, job_id), "events.jsonl"), 0)
        finally:
            conn.close()
        started = [Event.from_json(line) for line in raw.decode().splitlines() if '"started"' in line]
        os.killpg(os.getpgid(started[-1].data["pid"]), signal.SIGKILL)  # the process and its supervisor
        release(virtual_board, job_id)

    faults.start(virtual_board, kill_agent)
    result, events = _drive(virtual_board, spec, files, stats)
    starts = [e for e in events if e.type == "started"]
    assert stats.resumes == 1  # the follower saw the job stop without a result and restarted it
    assert len(starts) == 2 and 0 < starts[1].data["resumed_from_step"] <= HOLD_STEP
    assert [e.seq for e in events] == list(range(len(events)))
    _assert_same_as_reference(virtual_board, job_id, result, reference, tmp_path)


def test_sshd_restarted_mid_training_reconnects_and_completes(
    virtual_board: Board, digits_job, reference, faults: Faults, tmp_path: Path
) -> None:
    from tasks.vboard.faults import restart_sshd

    job_id = f"sshd-{os.getpid()}"
    spec, files = _created_held_job(faults, virtual_board, digits_job, job_id, HOLD_STEP)
    stats = FollowStats()

    def restart() -> None:  # while the job waits at HOLD_STEP: the follower is certainly polling
        assert wait_held(virtual_board, job_id) == HOLD_STEP
        restart_sshd(virtual_board.name, down_s=2.0)
        wait_for(lambda: stats.reconnects >= 1, "the follower reconnecting after the sshd restart")
        release(virtual_board, job_id)

    faults.start(virtual_board, restart)
    result, events = _drive(virtual_board, spec, files, stats)
    assert stats.reconnects >= 1 and stats.resumes == 0
    assert_events_complete(events, job_id)  # the training itself never stopped
    _assert_same_as_reference(virtual_board, job_id, result, reference, tmp_path)


def _cut_for(faults: Faults, board: Board, seconds: float) -> None:
    """Take the board's link down now (before the caller reads another byte), restore it later."""
    from tasks.vboard.faults import set_link

    def restore() -> None:
        time.sleep(seconds)
        set_link(board.name, up=True)

    with odl_home_env(faults.home):
        set_link(board.name, up=False)
    faults.start(board, restore)


def _blob_names(board: Board) -> list[str]:
    conn = connect(board)
    try:
        return conn.run(["ls", "-A", posixpath.join(board.root, "blobs")]).stdout.split()
    finally:
        conn.close()


@pytest.mark.parametrize("link", ["direct", "shaped"])
def test_link_cut_during_upload_fails_retryably_then_the_retry_lands_a_whole_blob(
    request: pytest.FixtureRequest, link: str, faults: Faults, tmp_path: Path
) -> None:
    # "shaped": 10 Mbit/s, 50 ms each way, 1% loss, through the delay proxy: the proxy must give up
    # on the dead link too (its own TCP_USER_TIMEOUT) and end the host's session
    virtual_board = request.getfixturevalue("virtual_board" if link == "direct" else "shaped_virtual_board")
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(1).bytes((96 if link == "direct" else 4) * 2**20))
    sha = file_sha256(big)
    cut = threading.Event()

    def progress(done: int, total: int) -> None:
        if done > total // 4 and not cut.is_set():
            cut.set()
            _cut_for(faults, virtual_board, 14)

    conn = connect(virtual_board)
    try:
        agent.install_agent(conn, virtual_board)  # blobs are listed and verified by the agent
        with pytest.raises((TransferError, DeviceUnreachable)) as info:
            blobs.upload_blobs(conn, virtual_board, {sha: big}, progress)
    finally:
        conn.close()
    assert cut.is_set() and info.value.retryable
    while cut.is_set() and _link_down(virtual_board):
        time.sleep(0.5)
    assert sha not in _blob_names(virtual_board)  # the half upload is never usable
    conn = connect(virtual_board)  # the retry (as the Prefect task does it: a new connection)
    try:
        report = blobs.upload_blobs(conn, virtual_board, {sha: big})
        assert report.uploaded == [sha]
        on_board = conn.run(["sha256sum", posixpath.join(virtual_board.root, "blobs", sha)]).stdout
        assert on_board.split()[0] == sha
        conn.run(["rm", "-f", posixpath.join(virtual_board.root, "blobs", sha)])
    finally:
        conn.close()


def _link_down(board: Board) -> bool:
    try:
        connect(board).close()
        return False
    except DeviceUnreachable:
        return True


def test_link_cut_during_download_leaves_no_file_then_retrieve_succeeds(
    virtual_board: Board, faults: Faults, digits_job, tmp_path: Path
) -> None:
    spec, files = digits_job(f"dl-{os.getpid()}", epochs=1)
    conn = connect(virtual_board)
    try:
        _, result = run.drive_job(conn, virtual_board, spec, files)
        jdir = jobs.job_dir(virtual_board, spec.job_id)  # a big output, so the cut lands mid-transfer
        conn.run(
            ["sh", "-c", 'head -c 100000000 /dev/urandom > "$1"', "sh", posixpath.join(jdir, "agent.log")]
        )
    finally:
        conn.close()
    out = tmp_path / "out"
    cut = threading.Event()
    real_get = SSHTransport.get

    def get_then_cut(self, remote_path, local, progress=None):  # the product's get, with a cut inside
        def prog(done: int, total: int) -> None:
            if done > 20 * 2**20 and not cut.is_set():
                cut.set()
                _cut_for(faults, virtual_board, 25)  # well past the ~10 s the transport takes to notice

        return real_get(self, remote_path, local, prog)

    conn = connect(virtual_board)
    try:
        conn.get = get_then_cut.__get__(conn)
        with pytest.raises((TransferError, DeviceUnreachable)) as info:
            retrieve(conn, spec.job_id, result, out, virtual_board)
    finally:
        conn.close()
    assert cut.is_set() and info.value.retryable
    assert not [p for p in out.rglob("*") if p.is_file() and p.name.endswith(".part")]
    assert not (out / "agent.log").exists()
    while _link_down(virtual_board):
        time.sleep(0.5)
    got = retrieve(virtual_board, spec.job_id, result, out)
    assert file_sha256(got["inference"]) == result.outputs["inference"].sha256
    assert (out / "agent.log").stat().st_size == 100_000_000


@pytest.fixture
def small_disk_board(virtual_board: Board, virtual_board_home: Path):
    """The virtual board with its agent root on a 40 MB tmpfs owned by the board user (mounted in
    the board's mount namespace: ``ip netns exec`` gave sshd its own)."""
    from tasks.vboard.lifecycle import board_dir

    with odl_home_env(virtual_board_home):
        sshd_pid = (board_dir(virtual_board.name) / "sshd.pid").read_text().strip()
    ns = ["nsenter", "-t", sshd_pid, "-m"]
    root = posixpath.join(posixpath.dirname(virtual_board.root), f"odl-small-{os.getpid()}")
    user = pwd.getpwnam(virtual_board.user)
    os.makedirs(root)
    opts = f"size=40m,uid={user.pw_uid},gid={user.pw_gid},mode=0750"
    subprocess.run([*ns, "mount", "-t", "tmpfs", "-o", opts, "tmpfs", root], check=True)
    try:
        yield dataclasses.replace(virtual_board, root=root)
    finally:
        subprocess.run([*ns, "umount", root], check=False)
        os.rmdir(root)


def test_board_disk_full(small_disk_board: Board, digits_job, tmp_path: Path) -> None:
    board = small_disk_board
    blob_dir = posixpath.join(board.root, "blobs")
    conn = connect(board)
    try:
        with pytest.raises(DeviceIncompatible, match="MB free disk"):  # info: far below 100 MB
            agent.install_agent(conn, board)
        big = tmp_path / "big.bin"
        big.write_bytes(np.random.default_rng(2).bytes(30 * 2**20))
        sha = file_sha256(big)
        with pytest.raises(DeviceIncompatible, match="not enough disk space"):  # checked before sending
            blobs.upload_blobs(conn, board, {sha: big})
        assert conn.run(["ls", "-A", blob_dir]).stdout.split() == []
        bigger = tmp_path / "bigger.bin"
        bigger.write_bytes(np.random.default_rng(3).bytes(48 * 2**20))
        with pytest.raises(DeviceIncompatible, match="disk full"):  # the disk fills during the transfer
            blobs._upload_one(conn, board, file_sha256(bigger), bigger, 3, None)
        assert conn.run(["ls", "-A", blob_dir]).stdout.split() == []  # no partial blob left

        spec, files = digits_job(f"disk-{os.getpid()}")
        blobs.upload_blobs(conn, board, files)
        jdir = jobs.create_job(conn, board, spec)
        filler = posixpath.join(board.root, "filler")
        conn.run(["sh", "-c", 'head -c 30000000 /dev/zero > "$1"', "sh", filler])  # disk fills before start
        res = conn.run(agent.agent_argv(board, "start", jdir), check=False)
        assert res.code == 0  # the check runs in the detached process
        while jobs.job_status(conn, board, spec.job_id)["state"] == "running":
            time.sleep(0.2)
        failed = jobs.read_result(conn, board, spec.job_id)
        assert failed.exit_code == ExitCode.NO_DISK and "free disk" in failed.error and failed.steps == 0
        assert not conn.exists(posixpath.join(jdir, "checkpoints"))
    finally:
        conn.close()
