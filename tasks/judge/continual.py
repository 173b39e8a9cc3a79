"""Continual-learning figures of nightly retrains: what each night's model knows of every earlier shard.

A nightly recipe trains on the shards a board application appends (``[data] board_dataset``); with
``[data] heldout`` the host keeps each shard's held-out part under the shard's name, and every run
evaluates its candidate on the parts of the shards it has learnt (the files it trained on and those
its warm-start lineage trained on). The registry records those figures per version; this module
turns the versions into the accuracy matrix ``R[night][shard]`` and the two figures users of the
field read, as Avalanche defines them (``avalanche.evaluation.metrics``):

* forgetting of shard *i* at night *k*: ``R[t_i][i] - R[k][i]``, where *t_i* is the first night that
  trained on *i* (the accuracy on the experience when first learnt, minus now); the night's
  forgetting is the mean over the shards learnt before it (Avalanche's stream forgetting);
* backward transfer: the mean of ``R[k][i] - R[t_i][i]`` over the same shards, i.e. minus the
  forgetting (Avalanche's StreamBWT): negative when the night lost what earlier nights learnt.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class _Version(Protocol):
    name: str
    info: dict[str, Any]
    metrics: dict[str, Any]

    @property
    def promoted(self) -> bool: ...


def learnt_shards(record: dict[str, Any] | None, seen: set[tuple[str, str]]) -> list[str]:
    """Names of the board files a candidate has learnt: those it trained on (``record``, the job's
    board-data record) and those its warm-start lineage trained on (``seen``), sorted."""
    names = {f["name"] for f in (record or {}).get("files", [])} | {name for name, _ in seen}
    return sorted(names)


def heldout_sets(folder: Path | None, learnt: Sequence[str]) -> dict[str, Path]:
    """Test-set name -> held-out file for each learnt shard that has one in ``folder``
    (``shard-0002.npz`` -> ``"shard-0002"``: ``<folder>/shard-0002.npz``)."""
    if folder is None:
        return {}
    found = {}
    for name in learnt:
        stem = Path(name).stem
        path = Path(folder) / f"{stem}.npz"
        if path.is_file():
            found[stem] = path
    return found


def night_rows(versions: Sequence[_Version]) -> list[dict[str, Any]]:
    """One row per recorded night that has held-out figures, oldest first: ``version``,
    ``promoted``, ``new`` (shards first learnt that night), ``scores`` (shard -> metric),
    ``forgetting`` (shard -> figure, for shards learnt on an earlier night), and the night's mean
    ``forgetting_mean`` and ``bwt`` (None when no earlier shard exists yet)."""
    first: dict[str, float] = {}
    rows = []
    for v in versions:
        scores = v.metrics.get("heldout") or {}
        if not isinstance(scores, dict) or not scores:
            continue
        earlier = {s: first[s] - float(x) for s, x in scores.items() if s in first}
        new = sorted(s for s in scores if s not in first)
        for s in new:
            first[s] = float(scores[s])
        mean = sum(earlier.values()) / len(earlier) if earlier else None
        rows.append({
            "version": v.name, "promoted": v.promoted, "metric": v.metrics.get("heldout_metric", "accuracy"),
            "new": new, "scores": {s: float(x) for s, x in scores.items()}, "forgetting": earlier,
            "forgetting_mean": mean, "bwt": None if mean is None else -mean,
        })  # fmt: skip
    return rows


def continual_md(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The report's section: each night's new shards, BWT and forgetting, then the metric per earlier
    shard's held-out part (two tables, so that neither outgrows a 1280 px window as shards add up)."""
    if not rows:
        return []
    shards = sorted({s for r in rows for s in r["scores"]})
    metric = rows[-1]["metric"]
    out = [
        "",
        "## What each night still knows (continual learning)",
        f"`{metric}` of each night's candidate on the held-out part of every shard it has learnt; "
        "forgetting = the figure when the shard was first learnt minus now, backward transfer (BWT) = "
        "minus the mean forgetting over earlier shards (Avalanche's definitions). 🔴 marks a shard "
        "that lost more than 0.02.",
        "",
        "| night | promoted | new shards | BWT | forgetting |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        bwt = "" if r["bwt"] is None else f"{r['bwt']:+.4f}"
        forget = "" if r["forgetting_mean"] is None else f"{r['forgetting_mean']:+.4f}"
        new = ", ".join(r["new"]) or "-"
        out.append(f"| {r['version']} | {'yes' if r['promoted'] else 'no'} | {new} | {bwt} | {forget} |")
    out += ["", "| night | " + " | ".join(shards) + " |", "|---|" + "---|" * len(shards)]
    for r in rows:
        out.append(f"| {r['version']} | " + " | ".join(_score(r, s) for s in shards) + " |")
    return out


def _score(row: dict[str, Any], shard: str) -> str:
    """A night's figure on a shard, with its change since the shard was first learnt: "0.850 (-0.050) 🔴"."""
    if shard not in row["scores"]:
        return ""
    lost = row["forgetting"].get(shard)
    flag = " 🔴" if lost is not None and lost > 0.02 else ""
    return f"{row['scores'][shard]:.3f}" + (f" ({-lost:+.3f}){flag}" if lost is not None else "")
