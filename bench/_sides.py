"""The training runtimes side by side in a corpus sweep (``--runtime ort-training|autograd|both``):
pass / specific / raw per runtime, and the models one runtime passes that the other does not.

A sweep gives one row per (model, runtime): ``name``, ``runtime``, ``result`` (``pass`` |
``specific`` | ``raw``) and ``message``; :func:`summary` turns them into the figures and the text.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

RUNTIMES = ("ort-training", "autograd")
KINDS = ("pass", "specific", "raw")


def add_runtime_argument(ap: argparse.ArgumentParser, child: bool = False) -> None:
    """The sweep's ``--runtime`` option (default ``ort-training``, the recipes' default); with
    ``child``, the hidden ``--child NAME --work DIR`` of a sweep that runs each model in a subprocess."""
    ap.add_argument(
        "--runtime",
        choices=[*RUNTIMES, "both"],
        default="ort-training",
        help="the recipes' training.runtime; both: every model under each, counts side by side",
    )
    if child:
        ap.add_argument("--child", help=argparse.SUPPRESS)
        ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)


def runtimes_of(choice: str) -> tuple[str, ...]:
    """The runtimes a ``--runtime`` choice runs."""
    return RUNTIMES if choice == "both" else (choice,)


def summary(rows: Sequence[dict], runtimes: Sequence[str]) -> tuple[dict, str]:
    """(figures, text): counts per runtime, and per runtime the names it passes and another does not."""
    by = {rt: {r["name"]: r for r in rows if r["runtime"] == rt} for rt in runtimes}
    counts = {rt: {k: sum(r["result"] == k for r in by[rt].values()) for k in KINDS} for rt in runtimes}
    names = [n for n in by[runtimes[0]] if all(n in by[rt] for rt in runtimes)]
    only = {
        rt: [
            n
            for n in names
            if by[rt][n]["result"] == "pass" and any(by[o][n]["result"] != "pass" for o in runtimes)
        ]
        for rt in runtimes
    }
    figures = {
        "runtimes": {rt: {"models": len(by[rt]), **counts[rt]} for rt in runtimes},
        "only_passes": only,
    }
    width = max(len(rt) for rt in runtimes)
    lines = [f"{'':10s}" + "".join(f"{rt:>{width + 2}s}" for rt in runtimes)]
    for kind in (*KINDS, "models"):
        cells = [counts[rt][kind] if kind != "models" else len(by[rt]) for rt in runtimes]
        lines.append(f"{kind:10s}" + "".join(f"{c:>{width + 2}d}" for c in cells))
    if len(runtimes) > 1:
        for rt in runtimes:
            lines.append(f"passes under {rt} only: {len(only[rt])}")
            for n in only[rt]:
                other = "; ".join(
                    f"{o}: {by[o][n]['message']}" for o in runtimes if by[o][n]["result"] != "pass"
                )
                lines.append(f"  {n}  ({other})")
    return figures, "\n".join(lines)
