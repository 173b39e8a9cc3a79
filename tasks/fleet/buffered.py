"""The fleet's buffered asynchronous mode (``[fleet] mode = "buffered"``): FedBuff (Nguyen et al.,
"Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022) over a board group.

    fleet = BufferedRun.start_run(inp, prep, group, boards, run_id)
    every board starts from fleet.version_checkpoint()      # the newest global model, version v
    fleet.arrive(board, base_version, result)                # whenever a board's job ends
    if fleet.full(): fleet.close_buffer()                    # every K arrivals: version v + 1
    the boards that arrived (or failed) start again from the newest version

Each board trains from the newest global model it can get and the host never waits for a slow
board: every ``buffer_size`` (K) arrivals are aggregated into the next global version. An update
that started from version ``b`` and arrives at version ``v`` has staleness ``s = v - b`` (the
global versions made since its start) and weighs ``(1 + s) ** -a`` (``staleness_exponent`` a;
0.5 is FedBuff's ``1 / sqrt(1 + s)``). Each arrival is rebased onto the current global weights
``g`` as ``g + weight * (w - base)`` (its own change, shrunk by its staleness) and the rebased
tensors go through the recipe's strategy exactly as a synchronous round's do: FedAvg's
sample-weighted mean of them is ``g + sum_i n_i / N * weight_i * (w_i - base_i)``, FedBuff's
aggregate with sample weights; FedAvgM and FedAdam step from it, and the robust strategies
(median, trimmed mean, Krum, Bulyan) combine the rebased tensors of the buffer (Krum and Bulyan
need ``buffer_size`` large enough for ``fleet.byzantine``). Differential privacy is refused with
this mode (its accountant counts one release per board per round).

A board whose job ends waits for the next global version before it starts again: training the
same model on the same data with the same seed would send the same update twice. So a buffer
holds at most one update per board, and a board that failed or missed ``deadline_s`` (per job)
also tries again from the next version. The run fails when the boards still training cannot fill
the buffer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import FleetError, Straggler
from tasks.fleet.outliers import update_figures
from tasks.fleet.rounds import BoardUpdate, FleetRun, board_row, why
from tasks.fleet.weights import Weights, nbytes, read_update


def staleness_weight(staleness: int, exponent: float) -> float:
    """``(1 + staleness) ** -exponent``: 1 for a fresh update, ``1 / sqrt(1 + s)`` at exponent 0.5."""
    if staleness < 0:
        raise ValueError(f"staleness {staleness} < 0")
    return float((1.0 + staleness) ** -exponent)


def rebase(global_w: Weights, base: Weights, trained: Weights, weight: float) -> Weights:
    """``global + weight * (trained - base)`` tensor by tensor (float64, each back to its dtype):
    an update trained from an older global model, moved onto the current one."""
    return {
        k: (
            g.astype(np.float64) + weight * (trained[k].astype(np.float64) - base[k].astype(np.float64))
        ).astype(g.dtype)
        for k, g in global_w.items()
    }


@dataclass
class BufferedRun(FleetRun):
    """A fleet run in buffered mode: the global version, the models boards still train from, the
    buffer of arrivals and what went wrong since the last aggregation."""

    version: int = 0  # aggregations made so far
    bases: dict[int, Weights] = field(default_factory=dict)  # versions some board trains from
    training: dict[str, int] = field(default_factory=dict)  # board -> the version it trains from
    buffer: list[tuple[str, int, BoardUpdate, Weights]] = field(default_factory=list)
    missing: dict[str, dict[str, Any]] = field(default_factory=dict)  # failed since the last aggregation

    def version_checkpoint(self) -> Path:
        """The newest global weights as a job checkpoint (``round-<v+1>/global.ckpt``: what the
        aggregation that makes version ``v + 1`` starts from), written once per version."""
        ckpt = self.folder / f"round-{self.version + 1:03d}" / "global.ckpt"
        return ckpt if ckpt.is_file() else self.round_checkpoint(self.version + 1)

    def started(self, board: str) -> int:
        """Record that ``board`` starts a job from the newest version; that version."""
        self.bases.setdefault(self.version, self.weights)
        self.training[board] = self.version
        return self.version

    def arrive(self, board: str, result: BoardUpdate | BaseException | None) -> None:
        """A board's job ended: its update joins the buffer (checked against the global model), or
        its failure is kept for the next aggregation's record."""
        base = self.training.pop(board)
        if not isinstance(result, BoardUpdate):
            late = isinstance(result, Straggler)
            self.missing[board] = {"status": "late" if late else "failed", "error": why(result)}
            return
        try:
            w = read_update(result.update, self.weights, board)
        except FleetError as exc:
            self.missing[board] = {"status": "rejected", "error": str(exc), **board_row(result)}
            return
        self.buffer.append((board, base, result, w))

    def full(self) -> bool:
        """Whether the buffer holds ``buffer_size`` arrivals."""
        return len(self.buffer) >= self.spec.buffer_size

    def check_progress(self) -> None:
        """FleetError (the failures recorded) when the boards still training cannot fill the
        buffer: each board waits for the next version, which only a full buffer makes."""
        if len(self.buffer) + len(self.training) >= self.spec.buffer_size:
            return
        k = self.version + 1
        self._save({**self._record(k), "aggregate": None})
        raise FleetError(
            f"aggregation {k}: the buffer holds {len(self.buffer)} of {self.spec.buffer_size} arrivals "
            f"(fleet.buffer_size) and {len(self.training)} boards are still training; "
            + "; ".join(f"{b}: {row['error']}" for b, row in self.missing.items())
        )

    def close_buffer(self, started: float | None = None) -> dict[str, Any]:
        """Aggregate the buffer into the next global version: each update rebased onto the current
        weights with its staleness weight, then the strategy; host evaluation; the record."""
        t0, k, old = time.monotonic(), self.version + 1, self.weights
        record = self._record(k)
        rebased, raw = [], []
        for board, base, res, w in self.buffer:
            weight = record["boards"][board]["weight"]
            rebased.append((rebase(old, self.bases[base], w, weight), res.samples))
            raw.append(rebase(old, self.bases[base], w, 1.0))
            record["boards"][board]["host"] = self._host_metrics(
                w, self.folder / f"round-{k:03d}" / f"{board}.ckpt"
            )
        try:
            new = self.strategy.apply(old, self.strategy.combine(old, rebased))
        except FleetError as exc:  # too few updates for the strategy (Krum, Bulyan)
            self._save({**record, "aggregate": None})
            raise FleetError(f"aggregation {k}: {exc}") from exc
        figures = update_figures(old, raw, new, self.strategy.excluded)
        for (board, *_), fig in zip(self.buffer, figures, strict=True):
            record["boards"][board]["update"] = fig
        record["outliers"] = [b for (b, *_), fig in zip(self.buffer, figures, strict=True) if fig["outlier"]]
        self.weights, self.version = new, k
        self.buffer, self.missing = [], {}
        self.bases = {v: w for v, w in self.bases.items() if v in self.training.values()}
        record["aggregate"] = self._host_metrics(new, self.folder / f"round-{k:03d}" / "aggregate.ckpt")
        record["host_seconds"] = round(time.monotonic() - t0, 3)
        if started is not None:
            record["wall_s"] = round(time.monotonic() - started, 3)
        self._save(record)
        return record

    def _record(self, k: int) -> dict[str, Any]:
        """Aggregation ``k``'s record before its aggregate: per board its arrival (base version,
        staleness, weight) or why it is not in the buffer."""
        boards: dict[str, dict[str, Any]] = {}
        for board, base, res, _ in self.buffer:
            s = self.version - base
            weight = staleness_weight(s, self.spec.staleness_exponent)
            boards[board] = {
                "status": "ok",
                **board_row(res),
                "base_version": base,
                "staleness": s,
                "weight": weight,
                "fetched": str(res.update),  # the trainable.npz on the host
            }
        for board in self.boards:
            if board in self.missing:
                boards[board] = self.missing[board]
            elif board in self.training and board not in boards:
                boards[board] = {"status": "training", "base_version": self.training[board]}
        ups = [res for _, _, res, _ in self.buffer]
        return {
            "round": k,
            "mode": "buffered",
            "boards": {b: boards[b] for b in self.boards if b in boards},
            "arrivals": [b for b, *_ in self.buffer],
            "took_part": [b for b, *_ in self.buffer],
            "min_boards": self.spec.min_boards,
            "buffer_size": self.spec.buffer_size,
            "staleness_exponent": self.spec.staleness_exponent,
            "samples": sum(r.samples for r in ups),
            "bytes_down": sum(r.bytes_down for r in ups),
            "bytes_up": sum(r.bytes_up for r in ups),
            "tensor_bytes": nbytes(self.weights),
            "elapsed_s": round(time.monotonic() - self.began, 3),
        }
