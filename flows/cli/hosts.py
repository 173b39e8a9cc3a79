"""``odl hosts up | down | status | sync``: simulated worker hosts of this ODL_HOME's stack
(:mod:`tasks.hosts`)."""

from __future__ import annotations

import argparse

from tasks.hosts import lifecycle


def cmd_hosts(args: argparse.Namespace) -> int:
    """Bring the hosts up or down, say what runs, or copy the boards to them again."""
    if args.action == "up":
        for rec in lifecycle.up(args.hosts, args.cpu_quota, not args.no_netns, args.limit):
            print(_line(rec))
        print("stop with: odl hosts down")
    elif args.action == "down":
        stopped = lifecycle.down()
        print("stopped: " + (", ".join(stopped) or "no host was up"))
    elif args.action == "sync":
        for rec in lifecycle.sync():
            print(f"{rec['name']}: boards {', '.join(rec['boards']) or 'none'}; {_caught(rec['caught_up'])}")
    else:
        found = lifecycle.status()
        for rec in found:
            state = "running" if rec["running"] else "not running"
            cpu = "" if rec["cpu_s"] is None else f", CPU {rec['cpu_s']:.1f} s"
            moved = "" if rec["bytes"] is None else f", {rec['bytes'] / 1e6:.1f} MB over its link"
            print(f"{_line(rec)}: {state}{cpu}{moved}")
        if not found:
            print("no host is up (odl hosts up --hosts N)")
    return 0


def _caught(summary: dict | None) -> str:
    """What catching up did, in a few words."""
    if summary is None:
        return "not caught up (the reason was logged)"
    fetched = ", ".join(summary["fetched"]) or "nothing"
    store = f"with {summary['store']}: fetched {fetched}; " if summary["store"] else "no store; "
    return f"caught up {store}{len(summary['removed'])} leftover(s) removed"


def _line(rec: dict) -> str:
    where = f"netns {rec['netns']}" if rec.get("netns") else "this machine's network"
    quota = f", {rec['cpu_quota']} CPU" if rec.get("cpu_quota") else ""
    return f"{rec['name']}: worker {rec['worker']} in {where}{quota}, home {rec['home']}"
