"""A shaped link for a virtual board: ``odl board up --link "rate=10mbit,delay=50ms,loss=1%"``.

This kernel has no ``tc netem``, so each property has its own mechanism (any subset of the three):

* ``rate``: a ``tbf`` qdisc on both ends of the board's veth pair: the host end shapes what the
  host sends (uploads), the board end, inside the board's namespace, what the board sends
  (downloads). Each direction gets the full rate, as on a full-duplex link.
* ``loss``: an nftables table ``inet odl_link`` in the board's namespace whose input and output
  chains drop that fraction of the packets crossing the board's interface (``numgen random``),
  both directions, with a counter per direction (:func:`loss_counters`).
* ``delay``: a user-space TCP proxy (:mod:`tasks.vboard.delay_proxy`, its own process, pid in
  state.json) on the host end of the veth pair, forwarding to the board's sshd and holding each
  chunk for the delay in each direction: a round trip costs at least twice the delay. The board's
  inventory entry then names the proxy's address, and the host key is pinned for it.

It needs the board's own network namespace (not ``--loopback``). The namespace and the host end of
the veth pair go with the board (``board_down``), taking qdiscs and the nftables table with them;
:func:`stop` ends the proxy.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import BoardError
from tasks.paths import PROJECT_ROOT
from tasks.vboard.sshd import ensure_installed, port_open, sh

FORM = "KEY=VALUE[,KEY=VALUE...] with rate=10mbit (bit|kbit|mbit|gbit), delay=50ms (ms|s), loss=1% (0-50%)"
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
NUMBER = r"(\d+(?:\.\d+)?)"
TABLE = "odl_link"
SCALE = 100_000  # loss resolution: numgen random mod SCALE < loss * SCALE / 100


@dataclass(frozen=True)
class LinkSpec:
    """A shaped link: rate in bit/s, one-way delay in ms, loss in percent of packets (None: off)."""

    rate_bps: int | None = None
    delay_ms: float | None = None
    loss_pct: float | None = None

    def __str__(self) -> str:
        parts = []
        if self.rate_bps is not None:
            parts.append(f"rate={_fmt_rate(self.rate_bps)}")
        if self.delay_ms is not None:
            parts.append(f"delay={self.delay_ms:g}ms")
        if self.loss_pct is not None:
            parts.append(f"loss={self.loss_pct:g}%")
        return ",".join(parts)


def _fmt_rate(bps: int) -> str:
    for unit in ("gbit", "mbit", "kbit"):
        if bps % RATE_UNITS[unit] == 0:
            return f"{bps // RATE_UNITS[unit]}{unit}"
    return f"{bps}bit"


def parse_link(text: str) -> LinkSpec:
    """``"rate=10mbit,delay=50ms,loss=1%"`` (any subset) as a LinkSpec; BoardError naming ``--link``."""
    values: dict[str, Any] = {}
    for item in (text or "").split(","):
        key, sep, val = (part.strip().lower() for part in item.partition("="))
        if not sep or key not in ("rate", "delay", "loss") or not val:
            raise BoardError(f"--link {text!r}: cannot read {item.strip()!r}; expected {FORM}")
        if key in values:
            raise BoardError(f"--link {text!r}: {key} is given twice; expected {FORM}")
        values[key] = _parse_value(text, key, val)
    return LinkSpec(values.get("rate"), values.get("delay"), values.get("loss"))


def _parse_value(text: str, key: str, val: str) -> float | int:
    forms = {"rate": NUMBER + r"(bit|kbit|mbit|gbit)", "delay": NUMBER + r"(ms|s)", "loss": NUMBER + r"%"}
    m = re.fullmatch(forms[key], val)
    if m is None:
        raise BoardError(f"--link {text!r}: {key}={val} has no unit or a wrong one; expected {FORM}")
    num = float(m.group(1))
    if key == "rate":
        bps = int(num * RATE_UNITS[m.group(2)])
        if not 8_000 <= bps <= 10**10:
            raise BoardError(f"--link {text!r}: rate must be between 8kbit and 10gbit; expected {FORM}")
        return bps
    if key == "delay":
        ms = num * (1000 if m.group(2) == "s" else 1)
        if not 0 < ms <= 10_000:
            raise BoardError(f"--link {text!r}: delay must be above 0 and at most 10s; expected {FORM}")
        return ms
    if not 0 < num <= 50:
        raise BoardError(f"--link {text!r}: loss must be above 0% and at most 50%; expected {FORM}")
    return num


def ensure_tools(spec: LinkSpec) -> None:
    """``tc`` for a rate, ``nft`` for loss (installed with apt-get, like sshd, when missing)."""
    if spec.rate_bps is not None and not shutil.which("tc"):
        raise BoardError("--link rate needs tc (Debian package iproute2): apt-get install iproute2")
    if spec.loss_pct is not None:
        ensure_installed("nft", "nftables")


def apply(bdir: Path, state: dict[str, Any], spec: LinkSpec) -> dict[str, Any]:
    """Shape the board's link as ``spec`` says; returns what to add to its state (the proxy)."""
    if not state.get("netns"):
        raise BoardError(
            "--link needs the board's own network namespace (a veth pair to shape); drop --loopback"
        )
    ensure_tools(spec)
    ns = ["ip", "netns", "exec", state["netns"]]
    if spec.rate_bps is not None:
        burst = max(32_000, spec.rate_bps // 8 // 100)  # bytes: >= 10 ms of traffic, >= a few GSO packets
        tbf = ["root", "tbf", "rate", f"{spec.rate_bps}bit", "burst", str(burst), "latency", "200ms"]
        sh(["tc", "qdisc", "replace", "dev", state["veth_host"], *tbf])
        sh([*ns, "tc", "qdisc", "replace", "dev", state["veth_board"], *tbf])
    if spec.loss_pct is not None:
        below = max(1, round(spec.loss_pct * SCALE / 100))
        rules = "\n".join(
            f"  chain {hook} {{\n    type filter hook {hook} priority 0; policy accept;\n"
            f'    {side} "{state["veth_board"]}" numgen random mod {SCALE} < {below} counter drop\n  }}'
            for hook, side in (("input", "iifname"), ("output", "oifname"))
        )
        subprocess.run([*ns, "nft", "delete", "table", "inet", TABLE], capture_output=True, check=False)
        sh([*ns, "nft", "-f", "-"], input=f"table inet {TABLE} {{\n{rules}\n}}\n")
    if spec.delay_ms is None:
        return {"proxy": None}
    return {"proxy": start_proxy(bdir, state, spec.delay_ms)}


def start_proxy(bdir: Path, state: dict[str, Any], delay_ms: float) -> dict[str, Any]:
    """Start the delay proxy on the host end of the veth pair; its address and pid."""
    ready = bdir / "proxy.port"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "tasks.vboard.delay_proxy", "--listen", state["host_ip"],
            "--to", f"{state['host']}:{state['port']}", "--delay-ms", f"{delay_ms:g}", "--ready", str(ready)]  # fmt: skip
    with open(bdir / "proxy.log", "ab") as log:
        proc = subprocess.Popen(argv, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)  # fmt: skip
    for _ in range(200):
        if ready.exists() and port_open(state["host_ip"], port := int(ready.read_text())):
            return {"host": state["host_ip"], "port": port, "pid": proc.pid, "delay_ms": delay_ms}
        if proc.poll() is not None:
            break
        time.sleep(0.025)
    proc.kill()
    raise BoardError(f"virtual board: the link's delay proxy did not start; see {bdir / 'proxy.log'}")


def proxy_alive(state: dict[str, Any]) -> bool:
    """Whether the board's delay proxy (if it has one) still runs."""
    proxy = state.get("proxy") or {}
    pid = proxy.get("pid")
    try:
        return bool(pid) and "tasks.vboard.delay_proxy" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def stop(bdir: Path, state: dict[str, Any]) -> bool:
    """End the board's delay proxy (only if that pid still is the proxy); whether one was stopped."""
    if not proxy_alive(state):
        return False
    pid = int(state["proxy"]["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    for _ in range(40):
        if not proxy_alive(state):
            break
        time.sleep(0.05)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    (bdir / "proxy.port").unlink(missing_ok=True)
    return True


def loss_counters(state: dict[str, Any]) -> dict[str, int]:
    """Packets the loss rule dropped so far, per direction (``to_board``, ``from_board``)."""
    out = sh(["ip", "netns", "exec", state["netns"], "nft", "list", "table", "inet", TABLE]).stdout
    drops = [int(n) for n in re.findall(r"counter packets (\d+) bytes \d+ drop", out)]
    return {"to_board": drops[0], "from_board": drops[1]}


def qdisc_stats(state: dict[str, Any]) -> str:
    """``tc -s qdisc`` of both ends of the veth pair (for status and debugging)."""
    host = sh(["tc", "-s", "qdisc", "show", "dev", state["veth_host"]]).stdout
    board = sh(
        ["ip", "netns", "exec", state["netns"], "tc", "-s", "qdisc", "show", "dev", state["veth_board"]]
    ).stdout
    return f"host end ({state['veth_host']}):\n{host}board end ({state['veth_board']}):\n{board}"
