"""Start, stop and report the simulated worker hosts of the first home (``$ODL_HOME``).

What ``up`` starts is recorded in ``$ODL_HOME/hosts/hosts.json`` (each host's home, namespace,
veth, worker pid, CPU quota) so ``down`` stops exactly that: the workers by their recorded pids
(their session: the flow runs they started go too), the namespaces and veths by name, the cgroups
it made, and IP forwarding when ``up`` turned it on. A host's worker reaches the first home's
server at the machine's end of its veth: the server must listen beyond 127.0.0.1 (``odl stack up
--db postgres --host 0.0.0.0``, or a private address) unless namespaces are unavailable."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tasks.errors import BoardError
from tasks.hosts import catchup
from tasks.hosts.share import share_boards
from tasks.paths import odl_home
from tasks.stack import StackError
from tasks.stack.processes import running_pid, spawn, stop_service, stop_services
from tasks.stack.server import POOL, stack_env
from tasks.vboard import cgroup
from tasks.vboard.sshd import make_netns

log = logging.getLogger(__name__)
FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
STORE_URL, STORE_PASSWORD = "ODL_STORE_URL", "ODL_STORE_PASSWORD_FILE"
HEARTBEAT_S = "30"  # a host's flow runs beat this often (Prefect's least): a silent one is lost
DROPPED = (
    "ODL_INVENTORY",
    "PREFECT_API_DATABASE_CONNECTION_URL",
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    "PREFECT_SERVER_API_AUTH_STRING",
)  # a host worker is a client: the server's settings stay home


def state_path(first: Path | None = None) -> Path:
    return (first or odl_home()) / "hosts" / "hosts.json"


def load(first: Path | None = None) -> dict[str, Any]:
    """The recorded hosts ``{"hosts": {name: record}, "forward_set": bool}`` (empty before up)."""
    path = state_path(first)
    return json.loads(path.read_text()) if path.is_file() else {"hosts": {}, "forward_set": False}


def _save(state: dict[str, Any], first: Path) -> None:
    path = state_path(first)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, path)


def check_counts(hosts: int, cpu_quota: float | None, limit: int) -> None:
    """Refuse a bad request in one line naming the flag."""
    if hosts < 1:
        raise StackError(f"--hosts {hosts}: at least one host")
    if cpu_quota is not None and not 0.01 <= cpu_quota <= (os.cpu_count() or 1):
        raise StackError(f"--cpu-quota {cpu_quota:g}: a number of CPUs in [0.01, {os.cpu_count()}]")
    if limit < 1:
        raise StackError(f"--limit {limit}: at least one flow run at a time per host")


def up(hosts: int, cpu_quota: float | None = None, netns: bool = True, limit: int = 1) -> list[dict]:
    """Bring up hosts ``h1..hN`` (those already up with the same settings and the same ``ODL_*``
    variables passed on, the store's among them, are kept; any beyond N stopped); their records."""
    check_counts(hosts, cpu_quota, limit)
    first = odl_home()
    env = stack_env(home=first)
    if env["ODL_STACK_DB"] != "postgres" or running_pid(first, "prefect-server") is None:
        raise StackError(f"odl hosts: no Prefect server on PostgreSQL runs for {first}: "
                         "`odl stack up --db postgres --host 0.0.0.0` first")  # fmt: skip
    use_ns = netns and shutil.which("ip") is not None
    if not use_ns:
        log.warning("odl hosts: no `ip netns` here: the hosts share this machine's network")
    state = load(first)
    for n in range(1, hosts + 1):
        name, old = f"h{n}", state["hosts"].get(f"h{n}")
        wanted = {"cpu_quota": cpu_quota, "limit": limit, "passed": passed_on()}
        if old and _alive(old) and all(old.get(k) == v for k, v in wanted.items()):
            share_boards(first, Path(old["home"]))
            continue
        if old:
            _stop(old)
        state["hosts"][name] = _start(first, name, env, use_ns, cpu_quota, limit, state)
        _save(state, first)
    for name in [h for h in state["hosts"] if int(h[1:]) > hosts]:
        _stop(state["hosts"].pop(name))
    _save(state, first)
    return [state["hosts"][f"h{n}"] for n in range(1, hosts + 1)]


def _start(first: Path, name: str, env: dict[str, str], use_ns: bool, quota: float | None,
           limit: int, state: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    home = first / "hosts" / name
    home.mkdir(parents=True, exist_ok=True)
    net: dict[str, Any] = {"netns": None}
    if use_ns:
        try:
            net = make_netns(f"host-{name}")
        except BoardError as exc:
            log.warning("odl hosts: %s: no network namespace (%s); on this machine's network", name, exc)
    api = env["PREFECT_API_URL"]
    if net["netns"]:
        if env["PREFECT_SERVER_API_HOST"] in ("127.0.0.1", "localhost", "::1"):
            _drop_netns(net)
            raise StackError(
                f"odl hosts: the Prefect server of {first} listens on 127.0.0.1 only, out of a host "
                "namespace's reach: `odl stack down`, then `odl stack up --db postgres --host 0.0.0.0`"
            )
        subprocess.run(["ip", "netns", "exec", net["netns"], "ip", "route", "replace", "default", "via",
                        net["host_ip"]], check=True, capture_output=True)  # fmt: skip
        state["forward_set"] = state.get("forward_set") or _enable_forwarding()
        api = f"http://{net['host_ip']}:{env['PREFECT_SERVER_API_PORT']}/api"
    wenv = host_env(env, home, api, net.get("host_ip"))
    worker = f"{socket.gethostname()}-{name}"
    prefect = str(Path(sys.executable).parent / "prefect")
    argv = [prefect, "worker", "start", "--pool", POOL, "--type", "process", "--name", worker,
            "--limit", str(limit)]  # fmt: skip
    prefix = ["ip", "netns", "exec", net["netns"]] if net["netns"] else []
    boards = share_boards(first, home)
    caught = catchup.as_host(prefix, wenv, name)  # before it takes work: new, or back after it died
    pid = spawn(wenv, "worker", prefix + argv)
    kept = {k: net.get(k) for k in ("netns", "veth_host", "host_ip")} | {"addr": net.get("host")}
    record = {"name": name, "home": str(home), "worker": worker, "pid": pid, "api": api,
              "cpu_quota": quota, "limit": limit, "passed": passed_on(), "caught_up": caught, **kept}  # fmt: skip
    if quota:
        try:
            cgroup.limit_cpu(name, quota, pid, kind="host")
        except BoardError as exc:
            _stop(record)
            raise StackError(f"odl hosts: {name}: {exc}") from exc
    record["boards"] = boards
    log.info("host %s: worker %s (pid %d) in %s", name, worker, pid, net["netns"] or "this network")
    return record


def passed_on() -> str:
    """A digest of the caller's ``ODL_*`` variables, which a host's worker inherits (the store's among
    them; a digest: ODL_ALERT_WEBHOOK may hold a token): a host started with others is restarted by
    ``up``, not kept."""
    passed = {k: v for k, v in os.environ.items() if k.startswith("ODL_") and k != "ODL_HOME"}
    return hashlib.sha256(json.dumps(passed, sort_keys=True).encode()).hexdigest()[:16]


def host_env(env: dict[str, str], home: Path, api: str, machine: str | None = None) -> dict[str, str]:
    """A host worker's environment: its own home and Prefect home, the server at ``api``, no
    database URL, flow-run heartbeats every 30 s (the first host's fleet flow tells a lost host by
    them); the store's address and password file passed on when set (the password copied into the
    host's home, 0600, never printed; a store on this machine's loopback at ``machine``, this
    machine's end of the host's veth: :func:`store_url_for`)."""
    wenv = {k: v for k, v in env.items() if k not in DROPPED}
    wenv.update(ODL_HOME=str(home), PREFECT_HOME=str(home / "prefect"), PREFECT_API_URL=api,
                PREFECT_FLOWS_HEARTBEAT_FREQUENCY=HEARTBEAT_S)  # fmt: skip
    wenv.pop(STORE_URL, None)
    wenv.pop(STORE_PASSWORD, None)
    if os.environ.get(STORE_URL):
        wenv[STORE_URL] = store_url_for(os.environ[STORE_URL], machine)
    secret = os.environ.get(STORE_PASSWORD)
    if secret:
        if not Path(secret).is_file():
            raise StackError(f"{STORE_PASSWORD}: no such file {secret}")
        copy = home / "store-password"
        copy.touch(mode=0o600)
        copy.chmod(0o600)
        copy.write_bytes(Path(secret).read_bytes())
        wenv[STORE_PASSWORD] = str(copy)
    return wenv


def store_url_for(url: str, machine: str | None) -> str:
    """``url`` as a host in a network namespace reaches it: a store on this machine's loopback
    (127.0.0.1, localhost, ::1) is at ``machine`` there, as the server is (its cluster must listen
    there too and let the hosts' addresses in); any other URL, or no namespace, as it is."""
    try:
        parts = urlsplit(url)
        loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # the host's own check says what is wrong with it, in one line
        return url
    if machine is None or not loopback:
        return url
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{machine}{port}" if user else f"{machine}{port}"))


def _enable_forwarding() -> bool:
    """Turn IPv4 forwarding on (a host's namespace reaches the boards' through this machine);
    whether this call turned it on."""
    if FORWARD.read_text().strip() == "1":
        return False
    FORWARD.write_text("1\n")
    return True


def _alive(record: dict[str, Any]) -> bool:
    return running_pid(Path(record["home"]), "worker") is not None and (
        not record.get("netns") or Path("/run/netns", record["netns"]).exists()
    )


def _drop_netns(net: dict[str, Any]) -> None:
    if net.get("netns"):
        subprocess.run(["ip", "netns", "del", net["netns"]], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", net["veth_host"]], capture_output=True, check=False)


def _stop(record: dict[str, Any]) -> None:
    stop_service(Path(record["home"]), "worker", 10.0)
    _drop_netns(record)
    if record.get("cpu_quota"):
        cgroup.remove(record["name"], kind="host")


def sync() -> list[dict[str, Any]]:
    """Each recorded host given the boards again and caught up with the store (as itself); their
    records, with ``boards`` and ``caught_up`` as now."""
    first = odl_home()
    env, out = stack_env(home=first), []
    for rec in load(first)["hosts"].values():
        home, prefix = Path(rec["home"]), ["ip", "netns", "exec", rec["netns"]] if rec.get("netns") else []
        boards = share_boards(first, home)
        caught = catchup.as_host(prefix, host_env(env, home, rec["api"], rec.get("host_ip")), rec["name"])
        out.append({**rec, "boards": boards, "caught_up": caught})
    return out


def down() -> list[str]:
    """Stop every host ``up`` recorded (workers, namespaces, cgroups), forwarding back off if up
    turned it on; the names stopped. Host homes are kept (their logs and prepared folders)."""
    first = odl_home()
    state = load(first)
    names = sorted(state["hosts"])
    records = [state["hosts"].pop(name) for name in names]
    stop_services([(Path(r["home"]), "worker") for r in records], 10.0)  # the hosts' workers at once
    for record in records:
        _stop(record)  # its namespace and cgroup (its worker already stopped)
    if state.get("forward_set"):
        FORWARD.write_text("0\n")
        state["forward_set"] = False
    _save(state, first)
    return names


def status() -> list[dict[str, Any]]:
    """Each recorded host: its record plus ``running``, its CPU quota now, the CPU its worker and
    the flow runs it waited for used (s) and the bytes through its veth (None without one)."""
    out = []
    for name, rec in sorted(load()["hosts"].items()):
        pid = running_pid(Path(rec["home"]), "worker")
        out.append({**rec, "running": pid is not None, "cpu_quota_now": cgroup.cpu_quota(name, kind="host"),
                    "cpu_s": cpu_seconds(pid), "bytes": link_bytes(rec)})  # fmt: skip
    return out


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU of ``pid`` and of the children it waited for (its flow runs), seconds."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def link_bytes(record: dict[str, Any]) -> int | None:
    """Bytes received plus sent on the host's veth (every byte to the server and the boards)."""
    if not record.get("veth_host"):
        return None
    stats = Path("/sys/class/net", record["veth_host"], "statistics")
    try:
        return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())
    except OSError:
        return None
