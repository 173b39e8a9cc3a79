"""A virtual board that can only dial out: its own network namespace behind a NAT router.

Where deployed boards live (a factory network, a cellular modem, a customer's firewall) the board has
a private address the host cannot route to, and a router in between masquerades what it sends and
drops every connection opened towards it. :func:`make_natnet` builds that here with two namespaces
of this project home's board ``NAME``::

    host  --veth 10.232.K.0/24-->  odlr-NAME (router: nftables masquerade, inbound dropped)
          --veth 192.168.7.0/24-->  odl-NAME (the board: 192.168.7.2, default route via the router)

Every pull board has the same private LAN (as two boards behind two home routers do); what the host
sees of each is its router's uplink address. The boards reach the host's endpoint at one address,
the lab gateway (:func:`ensure_gateway`: ``10.233.T.1/32`` of this home on the host's loopback), which
``odl board up --pull`` gives them. Traffic stays between the host and namespaces this module makes.
"""

from __future__ import annotations

import subprocess
import zlib
from typing import Any

from tasks.errors import BoardError
from tasks.vboard.owner import home_tag, machine_name
from tasks.vboard.sshd import free_subnet, sh

UPLINK = "10.232"  # host <-> router, one /24 per board
GATEWAY = "10.233"  # the lab gateway: one /32 per project home on lo, where the endpoint listens
LAN_ROUTER, LAN_BOARD = "192.168.7.1", "192.168.7.2"

ROUTER_RULES = """
table ip odlnat {
    chain postrouting { type nat hook postrouting priority srcnat; oifname "wan" masquerade; }
    chain forward {
        type filter hook forward priority filter; policy drop;
        iifname "lan" oifname "wan" accept;
        ct state established,related accept;
    }
    chain input {
        type filter hook input priority filter; policy drop;
        iifname "lo" accept;
        ct state established,related accept;
    }
}
"""


def gateway_address() -> str:
    """``10.233.T.1``: the address the pull boards of this home dial the endpoint at."""
    t = zlib.crc32(home_tag().encode()) % 250 + 1
    return f"{GATEWAY}.{t}.1"


def ensure_gateway() -> str:
    """Put this home's lab gateway address on the host's loopback unless it is there; the address."""
    addr = gateway_address()
    have = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", "lo"], capture_output=True, text=True)
    if f" {addr}/32 " not in have.stdout:
        sh(["ip", "addr", "add", f"{addr}/32", "dev", "lo"])
    return addr


def remove_gateway() -> None:
    """Remove this home's lab gateway address (its pull boards then reach nothing)."""
    subprocess.run(
        ["ip", "addr", "del", f"{gateway_address()}/32", "dev", "lo"], capture_output=True, check=False
    )


def make_natnet(name: str) -> dict[str, Any]:
    """The board's namespace behind its NAT router; the state ``remove_natnet`` undoes."""
    machine = machine_name(name)
    board_ns, router_ns = f"odl-{machine}", f"odlr-{machine}"
    k = free_subnet(machine, UPLINK)
    uplink_host, uplink_router = f"{UPLINK}.{k}.1", f"{UPLINK}.{k}.2"
    veth = f"odl{k}n"
    state = {"netns": board_ns, "router_ns": router_ns, "veth_host": veth, "uplink_host": uplink_host,
             "router_ip": uplink_router, "host": LAN_BOARD, "listen": LAN_BOARD}  # fmt: skip
    sh(["ip", "netns", "add", router_ns])
    try:
        sh(["ip", "netns", "add", board_ns])

        def rt(*cmd: str) -> None:
            sh(["ip", "netns", "exec", router_ns, *cmd])

        def bd(*cmd: str) -> None:
            sh(["ip", "netns", "exec", board_ns, *cmd])

        sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", "wan", "netns", router_ns])
        sh(["ip", "addr", "add", f"{uplink_host}/24", "dev", veth])
        sh(["ip", "link", "set", veth, "up"])
        rt("ip", "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", board_ns)
        rt("ip", "addr", "add", f"{uplink_router}/24", "dev", "wan")
        rt("ip", "addr", "add", f"{LAN_ROUTER}/24", "dev", "lan")
        for dev in ("lo", "wan", "lan"):
            rt("ip", "link", "set", dev, "up")
        rt("ip", "route", "add", "default", "via", uplink_host)
        rt("sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        sh(["ip", "netns", "exec", router_ns, "nft", "-f", "-"], input=ROUTER_RULES)
        bd("ip", "addr", "add", f"{LAN_BOARD}/24", "dev", "eth0")
        for dev in ("lo", "eth0"):
            bd("ip", "link", "set", dev, "up")
        bd("ip", "route", "add", "default", "via", LAN_ROUTER)
    except BoardError:
        remove_natnet(state)
        raise
    return state


def remove_natnet(state: dict[str, Any]) -> None:
    """Remove the board's namespace, its router's and the uplink."""
    for key in ("netns", "router_ns"):
        if state.get(key):
            subprocess.run(["ip", "netns", "del", state[key]], capture_output=True, check=False)
    if state.get("veth_host"):
        subprocess.run(["ip", "link", "del", state["veth_host"]], capture_output=True, check=False)
