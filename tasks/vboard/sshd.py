"""The virtual board's sshd and network: a private sshd (own config, host key, pidfile), a network
namespace with a veth pair and its own address (or loopback), and the host key pinned in the
project's known_hosts. Root-only test and demo infrastructure."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

from tasks.errors import BoardError
from tasks.paths import odl_home
from tasks.vboard.owner import machine_name

log = logging.getLogger(__name__)

SSHD = "/usr/sbin/sshd"
SUBNET = "10.231"


def known_hosts_path() -> Path:
    """The project's pinned known_hosts file."""
    return odl_home() / "known_hosts"


def sh(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise BoardError(f"virtual board: {' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def ensure_sshd_installed() -> None:
    ensure_installed(SSHD, "openssh-server")


def ensure_installed(binary: str, package: str) -> None:
    """Install Debian ``package`` with apt-get when ``binary`` (a path or a name on PATH) is missing."""
    if Path(binary).exists() or (os.sep not in binary and shutil.which(binary)):
        return
    log.info("installing %s with apt-get", package)
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    sh(["apt-get", "update", "-qq"], env=env)
    sh(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], env=env)


def network(name: str, use_netns: bool) -> dict[str, Any]:
    if use_netns and shutil.which("ip"):
        try:
            return make_netns(name)
        except BoardError as exc:
            log.warning("network namespace unavailable (%s); using loopback", exc)
    return {"netns": None, "host": "127.0.0.1", "port": free_port(), "listen": "127.0.0.1"}


def make_netns(name: str) -> dict[str, Any]:
    ns = f"odl-{machine_name(name)}"  # this project home's board: another home's vboard has its own
    k = free_subnet(machine_name(name))
    vh, vb = f"odl{k}h", f"odl{k}b"
    host_ip, board_ip = f"{SUBNET}.{k}.1", f"{SUBNET}.{k}.2"
    sh(["ip", "netns", "add", ns])
    try:
        sh(["ip", "link", "add", vh, "type", "veth", "peer", "name", vb, "netns", ns])
        sh(["ip", "addr", "add", f"{host_ip}/24", "dev", vh])
        sh(["ip", "link", "set", vh, "up"])
        for cmd in (
            ["ip", "addr", "add", f"{board_ip}/24", "dev", vb],
            ["ip", "link", "set", vb, "up"],
            ["ip", "link", "set", "lo", "up"],
            ["ip", "route", "add", "default", "via", host_ip],  # answers a simulated host's netns too
        ):
            sh(["ip", "netns", "exec", ns, *cmd])
    except BoardError:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", vh], capture_output=True, check=False)
        raise
    return {"netns": ns, "veth_host": vh, "veth_board": vb, "host": board_ip, "port": 22, "listen": board_ip,
            "host_ip": host_ip}  # fmt: skip


def free_subnet(name: str, prefix: str = SUBNET) -> int:
    """A ``k`` whose ``PREFIX.k.0/24`` no interface of the host uses, first tried from ``name``'s hash."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=False).stdout
    start = zlib.crc32(name.encode()) % 250
    for i in range(250):
        k = (start + i) % 250 + 1
        if f" {prefix}.{k}." not in used:
            return k
    raise BoardError(f"no free {prefix}.k.0/24 subnet for a virtual board")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_sshd_config(bdir: Path, state: dict[str, Any], host_key: Path) -> None:
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
    env = dict(state.get("env") or {})
    for key, val in env.items():
        if not key.replace("_", "").isalnum() or any(c in str(val) for c in " \t\n\"'"):
            raise BoardError(
                f"virtual board env: {key}={val!r}: expected NAME=VALUE without spaces or quotes"
            )
    if env:  # one line: sshd keeps the first SetEnv line only
        lines.append("SetEnv " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    (bdir / "sshd_config").write_text("\n".join(lines) + "\n")


def start_sshd(bdir: Path, state: dict[str, Any]) -> None:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    argv = [SSHD, "-f", str(bdir / "sshd_config"), "-E", str(bdir / "sshd.log")]
    sh([SSHD, "-t", "-f", str(bdir / "sshd_config")])
    if state.get("netns"):  # nsenter enters the network namespace only: unlike `ip netns exec`, which
        # mounts a fresh /sys, it leaves /sys/fs/cgroup visible, where the agent reads its RAM limit
        argv = ["nsenter", f"--net=/run/netns/{state['netns']}", *argv]
    if state.get("cpus"):
        argv = ["taskset", "-c", ",".join(str(i) for i in range(int(state["cpus"]))), *argv]
    sh(argv)
    for _ in range(100):
        if sshd_alive(bdir) and port_open(state["host"], int(state["port"])):
            return
        time.sleep(0.05)
    raise BoardError(f"virtual board sshd did not start; see {bdir / 'sshd.log'}")


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def sshd_alive(bdir: Path) -> bool:
    pid = read_pid(bdir / "sshd.pid")
    if pid is None:
        return False
    try:
        return "sshd" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def stop_pidfile(path: Path) -> bool:
    pid = read_pid(path)
    if pid is None or not sshd_alive(path.parent):
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


def pin_host_key(host: str, port: int, pub: Path) -> None:
    entry = host if int(port) == 22 else f"[{host}]:{port}"
    key_type, key_b64 = pub.read_text().split()[:2]
    unpin_host_key(host, port)
    path = known_hosts_path()
    with path.open("a") as f:
        f.write(f"{entry} {key_type} {key_b64}\n")


def unpin_host_key(host: str | None, port: int | None) -> None:
    path = known_hosts_path()
    if host is None or not path.exists():
        return
    entry = host if int(port or 22) == 22 else f"[{host}]:{port}"
    keep = [ln for ln in path.read_text().splitlines() if ln.split(" ", 1)[0] != entry]
    path.write_text("".join(f"{ln}\n" for ln in keep))
