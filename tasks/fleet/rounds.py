"""One federated run over a group of boards, as plain functions the fleet flow (``odl/fleet``) composes.

    fleet = FleetRun.start_run(inp, prep, group, boards, run_id, start_checkpoint)
    for r in 1..rounds:
        ckpt = fleet.round_checkpoint(r)                 # the global weights as a job checkpoint
        results = {b: board_round(b, inp, prep, ckpt, run_id, deadline, out_dir)}  # in parallel
        fleet.close_round(r, results)                    # quorum, aggregate, host evaluation, record
    fleet.final_model()                                  # the last aggregate's inference model

A board's part of a round and the checks before any board is asked are :mod:`tasks.fleet.board_round`
(re-exported here for the flow and its Prefect tasks).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks import stages
from tasks.board.inventory import Board
from tasks.checkpoint import checkpoint_weights, write_checkpoint
from tasks.errors import FleetError, Straggler
from tasks.fleet.board_round import BoardUpdate, board_round, check_fleet
from tasks.fleet.outliers import streamed_figures
from tasks.fleet.privacy import central_center, epsilon, privacy_record, privacy_spent
from tasks.fleet.strategies import Strategy, make_strategy
from tasks.fleet.strategies.base import streamed_mean
from tasks.fleet.weights import Weights, nbytes, read_update
from tasks.judge.evaluate import evaluate_cached
from tasks.judge.losses import host_loss
from tasks.paths import state_dir
from tasks.prepare import Prepared
from tasks.stages.judge import inference_of

log = logging.getLogger(__name__)

__all__ = ["BoardUpdate", "FleetRun", "board_round", "board_row", "check_fleet", "why"]


@dataclass
class FleetRun:
    """The host's side of a federated run: global weights, server state and the round records."""

    inp: stages.Inputs
    prep: Prepared
    group: str
    boards: list[str]
    run_id: str
    folder: Path
    weights: Weights
    strategy: Strategy = field(init=False)  # the aggregation, with its server state across rounds
    rounds: list[dict[str, Any]] = field(default_factory=list)
    start: dict[str, Any] = field(default_factory=dict)
    rng: np.random.Generator = field(default_factory=np.random.default_rng)  # central noise: OS entropy
    stopped: str = ""  # why the rounds ended before [fleet].rounds (the privacy budget)
    began: float = field(default_factory=time.monotonic)  # the run's start: records' elapsed_s

    def __post_init__(self) -> None:
        """A fresh strategy of the kind ``[fleet] strategy`` names (RecipeError for an unknown one)."""
        self.strategy = make_strategy(self.spec)

    @classmethod
    def start_run(
        cls, inp: stages.Inputs, prep: Prepared, group: str, boards: list[Board], run_id: str,
        start_checkpoint: Path | None = None, start: dict[str, Any] | None = None,
    ) -> FleetRun:  # fmt: skip
        """A run whose round 1 starts from ``start_checkpoint`` (a warm start) or the prepared one."""
        check_fleet(inp.recipe, boards)
        tag = "".join(c for c in run_id if c.isalnum())[:12]
        folder = state_dir("fleet", f"{inp.recipe.name}-{group}-{tag}")
        weights = checkpoint_weights(start_checkpoint or prep.checkpoint, trainable_only=True)
        fleet = cls(inp, prep, group, [b.name for b in boards], run_id, folder, weights)
        fleet.start = start or {"from": "base"}
        return fleet

    @property
    def spec(self) -> Any:
        return self.inp.recipe.fleet

    def round_checkpoint(self, r: int) -> Path:
        """The current global weights written into the prepared checkpoint (round ``r``'s start)."""
        base = self.prep.checkpoint
        return write_checkpoint(base, self.weights, self.folder / f"round-{r:03d}" / "global.ckpt")

    def close_round(
        self, r: int, results: dict[str, BoardUpdate | BaseException | None], started: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Check the quorum, aggregate the updates, evaluate on the host test set and record the
        round (``extra``: more fields of its record, e.g. a fanned-out round's group runs);
        FleetError (after recording) when fewer than ``min_boards`` boards finished."""
        t0 = time.monotonic()
        rdir = self.folder / f"round-{r:03d}"
        boards: dict[str, dict[str, Any]] = {}
        updates: list[tuple[Path, int]] = []  # each accepted update's file (checked) and samples
        for name in self.boards:
            res = results.get(name)
            if isinstance(res, BoardUpdate):
                try:
                    w = read_update(res.update, self.weights, name)
                except FleetError as exc:
                    boards[name] = {"status": "rejected", "error": str(exc), **board_row(res)}
                    continue
                updates.append((res.update, res.samples))
                local = self._host_metrics(w, rdir / f"{name}.ckpt")
                boards[name] = {"status": "ok", **board_row(res), "host": local}
            else:
                late = isinstance(res, Straggler)
                boards[name] = {"status": "late" if late else "failed", "error": why(res)}
        record: dict[str, Any] = {"round": r, "boards": boards, "min_boards": self.spec.min_boards}
        record.update(extra or {})
        record["took_part"] = [b for b, row in boards.items() if row["status"] == "ok"]
        record["bytes_down"] = sum(row.get("bytes_down", 0) for row in boards.values())
        record["bytes_up"] = sum(row.get("bytes_up", 0) for row in boards.values())
        record["tensor_bytes"] = nbytes(self.weights)
        if len(updates) < self.spec.min_boards:
            record["aggregate"] = None
            self._save(record)
            raise FleetError(
                f"round {r}: {len(updates)} of {len(self.boards)} boards finished, the quorum is "
                f"{self.spec.min_boards} (fleet.min_boards); {left_out(boards)}"
            )
        try:
            self.weights = self._aggregate(r, record["took_part"], updates, record)
        except FleetError as exc:  # too few updates for the strategy (Krum, Bulyan)
            record["aggregate"] = None
            self._save(record)
            raise FleetError(f"round {r}: {exc}") from exc
        record["samples"] = sum(n for _, n in updates)
        record["aggregate"] = self._host_metrics(self.weights, rdir / "aggregate.ckpt")
        record["host_seconds"] = round(time.monotonic() - t0, 3)
        if started is not None:  # the round's wall time, from its fan-out to its aggregate
            record["wall_s"] = round(time.monotonic() - started, 3)
        record["elapsed_s"] = round(time.monotonic() - self.began, 3)  # since the run started
        self._save(record)
        return record

    def _aggregate(
        self, r: int, names: list[str], updates: list[tuple[Path, int]], record: dict[str, Any]
    ) -> Weights:
        """The strategy's (or central privacy's) next weights; each board's update figures and the
        outliers, and the privacy spent, recorded in ``record``. The updates are read from their
        files as they are needed: a mean (FedAvg and its server optimizers) one at a time, a robust
        strategy or central privacy all at once (their buffer: every update of the round)."""
        old, priv = self.weights, self.spec.privacy
        load = self._loader(names, updates)
        if priv is not None and priv.mode == "central":
            center, record["noise"] = central_center(
                old, [load(i) for i in range(len(names))], priv, self.rng
            )
            self.strategy.excluded = ()
        elif self.strategy.streams:
            center = streamed_mean(load, len(names), [n for _, n in updates])
            self.strategy.excluded = ()
        else:
            center = self.strategy.combine(old, [(load(i), n) for i, (_, n) in enumerate(updates)])
        new = self.strategy.apply(old, center)
        figures = streamed_figures(old, load, len(names), new, self.strategy.excluded)
        for name, fig in zip(names, figures, strict=True):
            record["boards"][name]["update"] = fig
        record["outliers"] = [n for n, fig in zip(names, figures, strict=True) if fig["outlier"]]
        if priv is not None:
            record["privacy"] = privacy_record(priv, r)
        return new

    def _loader(self, names: list[str], updates: list[tuple[Path, int]]) -> Any:
        """``load(i)``: the i-th accepted update's tensors, read again from its file in the run's folder
        and checked again as when it was accepted (names, shapes, dtypes, finite values)."""

        def load(i: int) -> Weights:
            return read_update(updates[i][0], self.weights, names[i])

        return load

    def budget_allows(self, r: int) -> bool:
        """Whether round ``r`` keeps ε within ``[fleet.privacy] target_epsilon`` (always without a
        privacy table); when not, :attr:`stopped` says why and the run ends before it."""
        priv = self.spec.privacy
        if priv is None:
            return True
        eps = epsilon(priv.noise_multiplier, r, priv.delta)
        if eps <= priv.target_epsilon:
            return True
        spent = epsilon(priv.noise_multiplier, r - 1, priv.delta)
        self.stopped = (
            f"round {r} was not run: it would bring ε to {eps:.3g}, past target_epsilon "
            f"{priv.target_epsilon:g} (δ {priv.delta:g}); {r - 1} rounds run, ε {spent:.3g}"
        )
        self._save()
        return False

    def final_model(self) -> Path:
        """The aggregate after the last round, as an inference model (the candidate): the one the
        last round's host evaluation exported."""
        if not self.rounds or self.rounds[-1].get("aggregate") is None:
            raise FleetError("no round produced an aggregate")
        return self.folder / f"round-{self.rounds[-1]['round']:03d}" / "aggregate.onnx"

    def _host_metrics(self, weights: Weights, ckpt: Path) -> dict[str, Any]:
        """Write ``weights`` as ``ckpt``, export ``ckpt``'s inference model beside it (``.onnx``) and
        evaluate it on the host test set."""
        recipe = self.inp.recipe
        write_checkpoint(self.prep.checkpoint, weights, ckpt)
        model = inference_of(self.prep, ckpt, ckpt.with_suffix(".onnx"))
        cache = state_dir("cache", "evaluations")
        m = evaluate_cached(model, recipe.data.test, recipe.task, cache, host_loss(recipe, self.prep))
        return {k: m[k] for k in ("accuracy", "loss", "loss_kind", "samples") if k in m}

    def _save(self, record: dict[str, Any] | None = None) -> None:
        """Append ``record`` (if any) and write the run's ``rounds.json``."""
        if record is not None:
            self.rounds.append(record)
        (self.folder / "rounds.json").write_text(json.dumps(self.summary(), indent=2, default=str))

    def summary(self) -> dict[str, Any]:
        """Everything the report shows: the run, its start and every round's record."""
        return {
            "recipe": self.inp.recipe.name,
            "group": self.group,
            "boards": self.boards,
            "run_id": self.run_id,
            "strategy": asdict(self.spec),
            "start": self.start,
            "rounds": self.rounds,
            "stopped": self.stopped,
            "privacy": privacy_spent(self.spec.privacy, len(self.rounds), self.stopped),
        }


def board_row(res: BoardUpdate) -> dict[str, Any]:
    """A board update's record fields (job, samples, metrics, bytes, seconds): all but its tensors."""
    return {k: v for k, v in asdict(res).items() if k not in ("board", "update")}


NAMED = 3  # boards named for each way of being left out, in a round's one-line summary


def left_out(boards: dict[str, dict[str, Any]], named: int = NAMED) -> str:
    """The boards without an accepted update, in one line however many they are: per status (late,
    failed, rejected) how many, the first ``named`` of them and the first one's reason
    ("2 late (b0007, b0012): Straggler: ...; 1 rejected (b0003): ...")."""
    by_status: dict[str, list[str]] = {}
    for b, row in boards.items():
        if row["status"] != "ok":
            by_status.setdefault(row["status"], []).append(b)
    parts = []
    for status, names in by_status.items():
        shown = ", ".join(names[:named]) + (f" and {len(names) - named} more" if len(names) > named else "")
        reason = " ".join(str(boards[names[0]].get("error") or status).split())[:200]
        parts.append(f"{len(names)} {status} ({shown}): {reason}")
    return "; ".join(parts) or "none left out"


def why(exc: BaseException | None) -> str:
    """Why a board has no update: its exception in one line, or that the wait ended first."""
    if exc is None:
        return "no result (the round's wait ended first)"
    return f"{type(exc).__name__}: {exc}"[:400]
