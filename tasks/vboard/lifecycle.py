"""A virtual board on this machine: a private sshd for an unprivileged user, like a real board.

``board_up`` creates (idempotently) the user ``odl-NAME-TAG`` (TAG: the project home's, :mod:`tasks.vboard.owner`) with a key-only login, a board-like
Python env (numpy + onnxruntime-training-cpu by default; an x86_64 venv with a plain onnxruntime, or
an aarch64 userland under qemu: :mod:`tasks.vboard.boardenv`), a private sshd with its own config and host key (pinned into ``$ODL_HOME/known_hosts``), in its own
network namespace with its own address when ``ip netns`` works (else on loopback), and writes the
board into the inventory exactly as a user would describe a real one. What it starts is recorded
in ``$ODL_HOME/boards/NAME/state.json`` so ``board_down`` leaves nothing behind.

Its limits are the kernel's, as on a board: a RAM cap and a CPU quota in a cgroup its sshd joins
(:mod:`tasks.vboard.cgroup`), CPUs pinned with taskset, a board model's values at once with a
profile (:mod:`tasks.vboard.profiles`) and a shaped link: rate, delay, loss (:mod:`tasks.vboard.link`).
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from tasks.board.inventory import Board, remove_board, save_board, valid_board_name
from tasks.errors import BoardError
from tasks.paths import state_dir
from tasks.vboard import cgroup, natnet, pullboard
from tasks.vboard import link as shaped
from tasks.vboard.boardenv import BoardEnv, choose, ensure_env
from tasks.vboard.owner import open_to_board_user, unix_user
from tasks.vboard.profiles import resolve
from tasks.vboard.sshd import (
    ensure_sshd_installed,
    known_hosts_path,
    network,
    pin_host_key,
    sh,
    sshd_alive,
    start_sshd,
    stop_pidfile,
    unpin_host_key,
    write_sshd_config,
)

log = logging.getLogger(__name__)


def board_dir(name: str) -> Path:
    """``$ODL_HOME/boards/NAME``: the board's keys, sshd config, pidfile, log and state."""
    return state_dir("boards", valid_board_name(name))


@open_to_board_user()
def board_up(
    name: str,
    *,
    mem_mb: int | None = None,
    cpus: int | None = None,
    netns: bool = True,
    venv: Path | None = None,
    cpu_quota: float | None = None,
    env: dict[str, str] | None = None,
    profile: str | None = None,
    link: str | None = None,
    arch: str | None = None,
    ort: str | None = None,
    envs: Path | None = None,
    pull: tuple[str, str] | None = None,
) -> Board:
    """Bring up (or confirm) virtual board ``name``; returns its inventory entry.

    ``mem_mb`` caps the RAM of everything the board runs (a cgroup memory limit, no swap: the
    kernel kills a process that needs more), ``cpus`` pins sshd and everything it starts to that
    many CPUs, ``cpu_quota`` caps their total CPU time in a cgroup (e.g. 0.25 CPU: N boards sharing
    a host's cores as N real boards would not), ``profile`` takes all three from a board model
    (e.g. ``"stm32mp25"``; explicit values win), ``link`` shapes its network link
    (``"rate=10mbit,delay=50ms,loss=1%"``, netns boards only), ``env`` is set in every SSH session
    (e.g. ``{"ODL_AGENT_STEP_DELAY_S": "0.2"}`` for a slow board), ``venv`` shares an existing
    training venv (default: ``~odl-NAME/venv``). ``arch`` (``x86_64``, ``arm64``) and ``ort``
    (``training``, ``plain``, ``plain==VERSION``) choose the board's Python environment, built once
    and cached under ``envs`` (:mod:`tasks.vboard.boardenv`). ``pull`` (the endpoint's url and
    certificate pin) makes a board that can only dial out: behind a NAT router, no sshd, enrolled and
    running the agent's pull service (:mod:`tasks.vboard.pullboard`).
    """
    limits = resolve(profile, mem_mb=mem_mb, cpus=cpus, cpu_quota=cpu_quota, link=link, arch=arch, ort=ort)
    choice = choose(limits.pop("arch") or "x86_64", limits.pop("ort"))
    spec = shaped.parse_link(limits["link"]) if limits["link"] else None
    if spec and not netns:
        raise BoardError(
            "--link needs the board's own network namespace (a veth pair to shape); drop --loopback"
        )
    bdir = board_dir(name)
    state = load_state(bdir)
    wanted = {**limits, "link": str(spec) if spec else None, "profile": profile, "env": dict(env or {}),
              "board_env": choice.label}  # fmt: skip
    if pull:
        if spec:
            raise BoardError("--link shapes an SSH board's link; a pull board's is its NAT router's")
        return _pull_board_up(name, bdir, state, wanted, choice, venv, envs, pull)
    alive = sshd_alive(bdir) and (not (spec and spec.delay_ms) or shaped.proxy_alive(state))
    alive = alive and state.get("user") == unix_user(name)  # a board of before per-home names: renewed
    if alive and all((state.get(k) or ({} if k == "env" else None)) == v for k, v in wanted.items()):
        log.info("virtual board %s already up at %s:%s", name, state["host"], state["port"])
        return _board_entry(name, state)
    board_down(name)
    ensure_sshd_installed()
    user = unix_user(name)
    home = _ensure_user(user)
    key = _ensure_key(bdir / "id_ed25519", f"odl-host@{name}")
    _authorize(user, home, key.with_suffix(".pub"))
    built = ensure_env(choice, venv or home / "venv", envs)
    host_key = _ensure_key(bdir / "ssh_host_ed25519_key", f"odl-board@{name}")
    state = network(name, netns) | wanted | {"user": user, "home": str(home)} | _env_state(built)
    if spec and not state["netns"]:
        raise BoardError(f"board {name}: --link needs a network namespace, and none could be made here")
    write_sshd_config(bdir, state, host_key)
    (bdir / "state.json").write_text(json.dumps(state, indent=2))  # board_down can undo a failure below
    start_board_sshd(name, bdir, state)
    if spec:
        state |= shaped.apply(bdir, state, spec)
    entry = state.get("proxy") or state
    pin_host_key(entry["host"], entry["port"], host_key.with_suffix(".pub"))
    (bdir / "state.json").write_text(json.dumps(state, indent=2))
    board = _board_entry(name, state)
    save_board(board)
    log.info("virtual board %s up at %s:%s (user %s)", name, state["host"], state["port"], user)
    return board


def _pull_board_up(name: str, bdir: Path, state: dict[str, Any], wanted: dict[str, Any], choice: Any,
                   venv: Path | None, envs: Path | None, pull: tuple[str, str]) -> Board:  # fmt: skip
    """The pull-mode half of :func:`board_up` (see :mod:`tasks.vboard.pullboard`)."""
    url, pin = pull
    if pullboard.service_alive(bdir) and all(
        state.get(k) == v for k, v in (wanted | {"endpoint": url}).items()
    ):
        log.info("virtual pull board %s already up", name)
        return pullboard.entry(name, state)
    board_down(name)
    user = unix_user(name)
    home = _ensure_user(user)
    built = ensure_env(choice, venv or home / "venv", envs)
    state = (
        natnet.make_natnet(name)
        | wanted
        | {"user": user, "home": str(home), "endpoint": url}
        | _env_state(built)
    )
    (bdir / "state.json").write_text(json.dumps(state, indent=2))  # board_down can undo a failure below
    pullboard.install_agent_copy(state)
    pullboard.enrol(name, state, url, pin)
    pid = pullboard.start_service(bdir, state)
    if state.get("cpu_quota") or state.get("mem_mb"):
        cgroup.join(name, state, pid)
    log.info("virtual pull board %s up behind NAT (router %s), dialing %s", name, state["router_ip"], url)
    return pullboard.entry(name, state)


def board_down(name: str, *, purge: bool = False) -> dict[str, Any]:
    """Stop the board's sshd (a pull board's service) and remove its namespace(s); ``purge`` also
    removes user, data and entry."""
    bdir = board_dir(name)
    state = load_state(bdir)
    stopped = stop_pidfile(bdir / "sshd.pid") or pullboard.stop_service(bdir)
    if state.get("router_ns"):
        natnet.remove_natnet(state)
    elif state.get("netns"):
        subprocess.run(["ip", "netns", "del", state["netns"]], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", state["veth_host"]], capture_output=True, check=False)
    if state.get("proxy"):
        shaped.stop(bdir, state)
    if purge:
        user = state.get("user") or unix_user(name)
        kill_user_processes(user)
        subprocess.run(["userdel", "-r", user], capture_output=True, check=False)
        unpin_host_key(state.get("host"), state.get("port"))
        if state.get("proxy"):
            unpin_host_key(state["proxy"]["host"], state["proxy"]["port"])
        remove_board(name)
        shutil.rmtree(bdir, ignore_errors=True)
    if (state.get("cpu_quota") or state.get("mem_mb")) and (purge or stopped):
        cgroup.remove(name)
    return {"name": name, "stopped_sshd": stopped, "purged": purge}


@open_to_board_user()
def start_board_sshd(name: str, bdir: Path, state: dict[str, Any]) -> None:
    """Start the board's sshd and put it under the board's kernel limits (RAM cap, CPU quota)."""
    start_sshd(bdir, state)
    if state.get("cpu_quota") or state.get("mem_mb"):
        cgroup.join(name, state, int((bdir / "sshd.pid").read_text().split()[0]))


def board_status(name: str) -> dict[str, Any]:
    """Whether the board's sshd runs, where it listens, its profile, link and kernel limits now."""
    bdir = board_dir(name)
    state = load_state(bdir)
    live = {"memory": cgroup.memory(name), "cpu_quota_now": cgroup.cpu_quota(name)}
    if state.get("proxy"):
        live["proxy_running"] = shaped.proxy_alive(state)
    return {"name": name, "running": sshd_alive(bdir), **state, **live}


def _board_entry(name: str, state: dict[str, Any]) -> Board:
    entry = state.get("proxy") or state  # a delayed link: the host reaches the board through the proxy
    return Board(
        name=name,
        host=entry["host"],
        port=int(entry["port"]),
        user=state["user"],
        key=board_dir(name) / "id_ed25519",
        known_hosts=known_hosts_path(),
        root=f"{state['home']}/odl",
        python=state["python"],
        ort_version=state.get("ort_version") or choose().version,  # a state of before board envs
        arch=state.get("arch", ""),
        runtimes=tuple(state.get("runtimes") or ()),
    )


def _env_state(built: BoardEnv) -> dict[str, Any]:
    """What the board's environment is, as its state records it (and its inventory entry)."""
    return {"python": built.python, "arch": built.arch, "ort_version": built.ort_version,
            "runtimes": list(built.runtimes)}  # fmt: skip


def load_state(bdir: Path) -> dict[str, Any]:
    path = bdir / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _ensure_user(user: str) -> Path:
    try:
        return Path(pwd.getpwnam(user).pw_dir)
    except KeyError:
        pass
    sh(["useradd", "--create-home", "--shell", "/bin/sh", "--password", "*", user])
    home = Path(pwd.getpwnam(user).pw_dir)
    home.chmod(0o750)
    return home


def _ensure_key(path: Path, comment: str) -> Path:
    if not path.exists():
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path


def _authorize(user: str, home: Path, pub: Path) -> None:
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    auth = ssh / "authorized_keys"
    auth.write_text(pub.read_text())
    auth.chmod(0o600)
    sh(["chown", "-R", f"{user}:{user}", str(ssh)])
    ssh.chmod(0o700)


def kill_user_processes(user: str) -> None:
    """SIGKILL every process of Unix user ``user`` (a power cut of its virtual board)."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and proc.stat().st_uid == uid:
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            pass
