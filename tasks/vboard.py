"""A virtual board on this machine: a private sshd for an unprivileged user, like a real board.

``board_up`` creates (idempotently) the user ``odl-NAME`` with a key-only login, a board-like
Python env (numpy + onnxruntime-training-cpu, from :func:`tasks.boardenv.ensure_board_venv`), a
private sshd with its own config and host key (pinned into ``$ODL_HOME/known_hosts``), in its own
network namespace with its own address when ``ip netns`` works (else on loopback), and writes the
board into the inventory exactly as a user would describe a real one. What it starts is recorded
in ``$ODL_HOME/boards/NAME/state.json`` so ``board_down`` leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

from tasks.errors import BoardError
from tasks.inventory import Board, remove_board, save_board, valid_board_name
from tasks.paths import odl_home, state_dir

log = logging.getLogger(__name__)

SSHD = "/usr/sbin/sshd"
SUBNET = "10.231"
ORT_VERSION = "1.19.2"


def board_dir(name: str) -> Path:
    """``$ODL_HOME/boards/NAME``: the board's keys, sshd config, pidfile, log and state."""
    return state_dir("boards", valid_board_name(name))


def known_hosts_path() -> Path:
    """The project's pinned known_hosts file."""
    return odl_home() / "known_hosts"


def board_up(
    name: str,
    *,
    mem_mb: int | None = None,
    cpus: int | None = None,
    netns: bool = True,
    venv: Path | None = None,
) -> Board:
    """Bring up (or confirm) virtual board ``name``; returns its inventory entry.

    ``mem_mb`` caps the RAM the agent sees (``ODL_AGENT_FAKE_MEM_MB``), ``cpus`` pins sshd and
    everything it starts to that many CPUs, ``venv`` shares an existing board venv (default:
    ``~odl-NAME/venv``).
    """
    bdir = board_dir(name)
    state = _load_state(bdir)
    if _sshd_alive(bdir) and state.get("mem_mb") == mem_mb and state.get("cpus") == cpus:
        log.info("virtual board %s already up at %s:%s", name, state["host"], state["port"])
        return _board_entry(name, state)
    board_down(name)
    _ensure_sshd_installed()
    user = f"odl-{name}"
    home = _ensure_user(user)
    key = _ensure_key(bdir / "id_ed25519", f"odl-host@{name}")
    _authorize(user, home, key.with_suffix(".pub"))
    python = _ensure_env(venv or home / "venv")
    host_key = _ensure_key(bdir / "ssh_host_ed25519_key", f"odl-board@{name}")
    state = _network(name, netns) | {
        "mem_mb": mem_mb,
        "cpus": cpus,
        "user": user,
        "home": str(home),
        "python": python,
    }
    _write_sshd_config(bdir, state, host_key)
    _start_sshd(bdir, state)
    _pin_host_key(state["host"], state["port"], host_key.with_suffix(".pub"))
    (bdir / "state.json").write_text(json.dumps(state, indent=2))
    board = _board_entry(name, state)
    save_board(board)
    log.info("virtual board %s up at %s:%s (user %s)", name, state["host"], state["port"], user)
    return board


def board_down(name: str, *, purge: bool = False) -> dict[str, Any]:
    """Stop the board's sshd and remove its namespace; ``purge`` also removes user, data and entry."""
    bdir = board_dir(name)
    state = _load_state(bdir)
    stopped = _stop_pidfile(bdir / "sshd.pid")
    if state.get("netns"):
        subprocess.run(["ip", "netns", "del", state["netns"]], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", state["veth_host"]], capture_output=True, check=False)
    if purge:
        user = f"odl-{name}"
        _kill_user_processes(user)
        subprocess.run(["userdel", "-r", user], capture_output=True, check=False)
        _unpin_host_key(state.get("host"), state.get("port"))
        remove_board(name)
        shutil.rmtree(bdir, ignore_errors=True)
    return {"name": name, "stopped_sshd": stopped, "purged": purge}


def board_status(name: str) -> dict[str, Any]:
    """Whether the board's sshd runs, and where it listens."""
    bdir = board_dir(name)
    state = _load_state(bdir)
    return {"name": name, "running": _sshd_alive(bdir), **state}


def set_link(name: str, up: bool) -> None:
    """Bring the board's network interface up or down (fault injection; netns boards only)."""
    state = _load_state(board_dir(name))
    if not state.get("netns"):
        raise BoardError(f"board {name}: link control needs a network-namespace board")
    _sh(
        [
            "ip",
            "netns",
            "exec",
            state["netns"],
            "ip",
            "link",
            "set",
            state["veth_board"],
            "up" if up else "down",
        ]
    )


def restart_sshd(name: str, down_s: float = 0.0) -> None:
    """Stop the board's sshd and every SSH session it serves (a reboot-like drop of all
    connections; processes detached from SSH, like a training agent, keep running), wait
    ``down_s`` seconds, then start it again (fault injection)."""
    bdir = board_dir(name)
    state = _load_state(bdir)
    master = _read_pid(bdir / "sshd.pid")
    doomed = [pid for pid in _descendants(master) if _comm(pid) == "sshd"] if master else []
    _stop_pidfile(bdir / "sshd.pid")
    for pid in doomed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(down_s)
    _start_sshd(bdir, state)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _board_entry(name: str, state: dict[str, Any]) -> Board:
    return Board(
        name=name,
        host=state["host"],
        port=int(state["port"]),
        user=state["user"],
        key=board_dir(name) / "id_ed25519",
        known_hosts=known_hosts_path(),
        root=f"{state['home']}/odl",
        python=state["python"],
        ort_version=ORT_VERSION,
    )


def _sh(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise BoardError(f"virtual board: {' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _load_state(bdir: Path) -> dict[str, Any]:
    path = bdir / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _ensure_sshd_installed() -> None:
    if Path(SSHD).exists():
        return
    log.info("installing openssh-server with apt-get")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    _sh(["apt-get", "update", "-qq"], env=env)
    _sh(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"], env=env)


def _ensure_user(user: str) -> Path:
    try:
        return Path(pwd.getpwnam(user).pw_dir)
    except KeyError:
        pass
    _sh(["useradd", "--create-home", "--shell", "/bin/sh", "--password", "*", user])
    home = Path(pwd.getpwnam(user).pw_dir)
    home.chmod(0o750)
    return home


def _ensure_key(path: Path, comment: str) -> Path:
    if not path.exists():
        _sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path


def _authorize(user: str, home: Path, pub: Path) -> None:
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    auth = ssh / "authorized_keys"
    auth.write_text(pub.read_text())
    auth.chmod(0o600)
    _sh(["chown", "-R", f"{user}:{user}", str(ssh)])
    ssh.chmod(0o700)


def _ensure_env(venv: Path) -> str:
    from tasks.boardenv import ensure_board_venv  # the agent area's board-like env

    return str(ensure_board_venv(venv))


def _network(name: str, use_netns: bool) -> dict[str, Any]:
    if use_netns and shutil.which("ip"):
        try:
            return _make_netns(name)
        except BoardError as exc:
            log.warning("network namespace unavailable (%s); using loopback", exc)
    return {"netns": None, "host": "127.0.0.1", "port": _free_port(), "listen": "127.0.0.1"}


def _make_netns(name: str) -> dict[str, Any]:
    ns = f"odl-{name}"
    k = _free_subnet(name)
    vh, vb = f"odl{k}h", f"odl{k}b"
    host_ip, board_ip = f"{SUBNET}.{k}.1", f"{SUBNET}.{k}.2"
    _sh(["ip", "netns", "add", ns])
    try:
        _sh(["ip", "link", "add", vh, "type", "veth", "peer", "name", vb, "netns", ns])
        _sh(["ip", "addr", "add", f"{host_ip}/24", "dev", vh])
        _sh(["ip", "link", "set", vh, "up"])
        for cmd in (
            ["ip", "addr", "add", f"{board_ip}/24", "dev", vb],
            ["ip", "link", "set", vb, "up"],
            ["ip", "link", "set", "lo", "up"],
        ):
            _sh(["ip", "netns", "exec", ns, *cmd])
    except BoardError:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", vh], capture_output=True, check=False)
        raise
    return {"netns": ns, "veth_host": vh, "veth_board": vb, "host": board_ip, "port": 22, "listen": board_ip}


def _free_subnet(name: str) -> int:
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=False).stdout
    start = zlib.crc32(name.encode()) % 250
    for i in range(250):
        k = (start + i) % 250 + 1
        if f" {SUBNET}.{k}." not in used:
            return k
    raise BoardError(f"no free {SUBNET}.k.0/24 subnet for a virtual board")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_sshd_config(bdir: Path, state: dict[str, Any], host_key: Path) -> None:
    lines = [
        f"Port {state['port']}",
        f"ListenAddress {state['listen']}",
        f"HostKey {host_key}",
        f"PidFile {bdir / 'sshd.pid'}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin no",
        f"AllowUsers {state['user']}",
        "UsePAM no",
        "Subsystem sftp internal-sftp",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "PrintMotd no",
        "ClientAliveInterval 5",
        "ClientAliveCountMax 3",
        "MaxSessions 32",
        "MaxStartups 32:30:64",
    ]
    if state.get("mem_mb"):
        lines.append(f"SetEnv ODL_AGENT_FAKE_MEM_MB={int(state['mem_mb'])}")
    (bdir / "sshd_config").write_text("\n".join(lines) + "\n")


def _start_sshd(bdir: Path, state: dict[str, Any]) -> None:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    argv = [SSHD, "-f", str(bdir / "sshd_config"), "-E", str(bdir / "sshd.log")]
    _sh([SSHD, "-t", "-f", str(bdir / "sshd_config")])
    if state.get("netns"):
        argv = ["ip", "netns", "exec", state["netns"], *argv]
    if state.get("cpus"):
        argv = ["taskset", "-c", ",".join(str(i) for i in range(int(state["cpus"]))), *argv]
    _sh(argv)
    for _ in range(100):
        if _sshd_alive(bdir) and _port_open(state["host"], int(state["port"])):
            return
        time.sleep(0.05)
    raise BoardError(f"virtual board sshd did not start; see {bdir / 'sshd.log'}")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _sshd_alive(bdir: Path) -> bool:
    pid = _read_pid(bdir / "sshd.pid")
    if pid is None:
        return False
    try:
        return "sshd" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _stop_pidfile(path: Path) -> bool:
    pid = _read_pid(path)
    if pid is None or not _sshd_alive(path.parent):
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):  # the listener must be gone before a restart binds
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.05)
        else:
            continue
        break
    path.unlink(missing_ok=True)
    return True


def _kill_user_processes(user: str) -> None:
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


def _pin_host_key(host: str, port: int, pub: Path) -> None:
    entry = host if int(port) == 22 else f"[{host}]:{port}"
    key_type, key_b64 = pub.read_text().split()[:2]
    _unpin_host_key(host, port)
    path = known_hosts_path()
    with path.open("a") as f:
        f.write(f"{entry} {key_type} {key_b64}\n")


def _unpin_host_key(host: str | None, port: int | None) -> None:
    path = known_hosts_path()
    if host is None or not path.exists():
        return
    entry = host if int(port or 22) == 22 else f"[{host}]:{port}"
    keep = [ln for ln in path.read_text().splitlines() if ln.split(" ", 1)[0] != entry]
    path.write_text("".join(f"{ln}\n" for ln in keep))
