"""One federated run over a group of boards, as plain functions the fleet flow (``odl/fleet``) composes.

    fleet = FleetRun.start_run(inp, prep, group, boards, run_id, start_checkpoint)
    for r in 1..rounds:
        ckpt = fleet.round_checkpoint(r)                 # the global weights as a job checkpoint
        results = {b: board_round(b, inp, prep, ckpt, run_id, deadline, out_dir)}  # in parallel
        fleet.close_round(r, results)                    # quorum, aggregate, host evaluation, record
    fleet.final_model()                                  # the last aggregate's inference model

A board's part of a round lists its dataset folder, deploys (the round's checkpoint is the only new
blob after the first round), trains there on its own data, and sends back ``trainable.npz`` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks import stages
from tasks.board.control import agent_json
from tasks.board.inventory import Board
from tasks.board.jobs import job_dir
from tasks.board.transport import connect
from tasks.checkpoint import checkpoint_weights, write_checkpoint
from tasks.errors import FleetError, RecipeError, Straggler
from tasks.fleet.outliers import update_figures
from tasks.fleet.privacy import (
    central_center,
    check_budget,
    epsilon,
    local_privacy,
    privacy_record,
    privacy_spent,
)
from tasks.fleet.strategies import Strategy, check_group, make_strategy
from tasks.fleet.weights import Weights, nbytes, read_update
from tasks.hashing import file_sha256
from tasks.judge.evaluate import evaluate_cached
from tasks.judge.losses import host_loss
from tasks.paths import state_dir
from tasks.prepare import Prepared
from tasks.stages import nightly
from tasks.stages.judge import inference_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BoardUpdate:
    """One board's part of a round: what it trained on and the tensors it sent back."""

    board: str
    job_id: str
    samples: int
    update: Path  # trainable.npz on the host
    metrics: dict[str, float]  # the job's final metrics (train_loss, eval_loss, eval_accuracy ...)
    bytes_down: int  # blobs uploaded to the board for this round
    bytes_up: int  # trainable.npz
    seconds: float  # the whole part: list, deploy, train, fetch
    train_s: float  # the job's own time on the board (result.json duration_s)
    files: int  # dataset files trained on


def check_fleet(recipe: Any, boards: list[Board]) -> None:
    """A fleet needs board-side data, a reachable quorum, a group its strategy can combine (Krum,
    Bulyan: enough boards for ``fleet.byzantine``) and, when private, a budget for one round at
    least: RecipeError naming the field."""
    if recipe.data.board_dataset is None:
        raise RecipeError(
            "data.board_dataset", "the folder on each board holding its own data (a fleet trains there)"
        )
    if recipe.fleet.min_boards > len(boards):
        raise RecipeError(
            "fleet.min_boards", f"at most the group's {len(boards)} boards", recipe.fleet.min_boards
        )
    check_group(recipe.fleet, len(boards))
    if recipe.fleet.privacy is not None:
        check_budget(recipe.fleet.privacy)


def board_round(
    board: Board,
    inp: stages.Inputs,
    prep: Prepared,
    checkpoint: Path,
    run_id: str,
    deadline: float,
    out_dir: Path,
    on_event: Callable[[Any], None] | None = None,
) -> BoardUpdate:
    """Train one round on ``board`` from ``checkpoint`` on the board's own data; fetch only its
    trained tensors. Past ``deadline`` (monotonic) it raises Straggler and cancels the job there."""
    t0 = time.monotonic()
    data = nightly.board_data(inp.recipe, board)
    assert data is not None  # check_fleet: the recipe names a board dataset
    extra = file_sha256(checkpoint) + "".join(f["sha256"] for f in data.record["files"])
    spec, files = stages.job_spec(
        inp, prep, stages.job_id(inp, run_id, extra), checkpoint=checkpoint, train_data=data.ref
    )
    # local differential privacy: the board clips and noises its update before it leaves
    spec = dataclasses.replace(spec, privacy=local_privacy(inp.recipe.fleet.privacy))
    deployed = stages.deploy(board, spec, files)
    try:
        training = stages.train(board, spec, files, on_event=on_event, end_orphans=True, deadline=deadline)
    except Straggler:
        _cancel(board, spec.job_id)
        raise
    got = stages.retrieve(board, training, out_dir, only=("trainable",))
    update = got.files["trainable"]
    return BoardUpdate(
        board=board.name,
        job_id=spec.job_id,
        samples=int(data.record["samples"]),
        update=update,
        metrics=dict(training.result.metrics),
        bytes_down=deployed.bytes_sent,
        bytes_up=update.stat().st_size,
        seconds=round(time.monotonic() - t0, 3),
        train_s=float(training.result.duration_s),
        files=len(data.record["files"]),
    )


def _cancel(board: Board, job_id: str) -> None:
    """Ask the board to stop a straggler's job (best effort: the board may be unreachable; the
    next round's job ends it anyway, as an orphan)."""
    with contextlib.suppress(Exception), connect(board) as conn:
        agent_json(conn, board, "cancel", job_dir(board, job_id))


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
        self, r: int, results: dict[str, BoardUpdate | BaseException | None], started: float | None = None
    ) -> dict[str, Any]:
        """Check the quorum, aggregate the updates, evaluate on the host test set and record the
        round; FleetError (after recording) when fewer than ``min_boards`` boards finished."""
        t0 = time.monotonic()
        rdir = self.folder / f"round-{r:03d}"
        boards: dict[str, dict[str, Any]] = {}
        updates: list[tuple[Weights, int]] = []
        for name in self.boards:
            res = results.get(name)
            if isinstance(res, BoardUpdate):
                try:
                    w = read_update(res.update, self.weights, name)
                except FleetError as exc:
                    boards[name] = {"status": "rejected", "error": str(exc), **_board_row(res)}
                    continue
                updates.append((w, res.samples))
                local = self._host_metrics(w, rdir / f"{name}.ckpt")
                boards[name] = {"status": "ok", **_board_row(res), "host": local}
            else:
                late = isinstance(res, Straggler)
                boards[name] = {"status": "late" if late else "failed", "error": _why(res)}
        record: dict[str, Any] = {"round": r, "boards": boards, "min_boards": self.spec.min_boards}
        record["took_part"] = [b for b, row in boards.items() if row["status"] == "ok"]
        record["bytes_down"] = sum(row.get("bytes_down", 0) for row in boards.values())
        record["bytes_up"] = sum(row.get("bytes_up", 0) for row in boards.values())
        record["tensor_bytes"] = nbytes(self.weights)
        if len(updates) < self.spec.min_boards:
            record["aggregate"] = None
            self._save(record)
            missing = {
                b: row.get("error", row["status"]) for b, row in boards.items() if row["status"] != "ok"
            }
            raise FleetError(
                f"round {r}: {len(updates)} of {len(self.boards)} boards finished, the quorum is "
                f"{self.spec.min_boards} (fleet.min_boards); "
                + "; ".join(f"{b}: {why}" for b, why in missing.items())
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
        self._save(record)
        return record

    def _aggregate(
        self, r: int, names: list[str], updates: list[tuple[Weights, int]], record: dict[str, Any]
    ) -> Weights:
        """The strategy's (or central privacy's) next weights; each board's update figures and the
        outliers, and the privacy spent, recorded in ``record``."""
        old, priv = self.weights, self.spec.privacy
        if priv is not None and priv.mode == "central":
            center, record["noise"] = central_center(old, [w for w, _ in updates], priv, self.rng)
            self.strategy.excluded = ()
        else:
            center = self.strategy.combine(old, updates)
        new = self.strategy.apply(old, center)
        figures = update_figures(old, [w for w, _ in updates], new, self.strategy.excluded)
        for name, fig in zip(names, figures, strict=True):
            record["boards"][name]["update"] = fig
        record["outliers"] = [n for n, fig in zip(names, figures, strict=True) if fig["outlier"]]
        if priv is not None:
            record["privacy"] = privacy_record(priv, r)
        return new

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

    def _save(self, record: dict[str, Any]) -> None:
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


def _board_row(res: BoardUpdate) -> dict[str, Any]:
    return {k: v for k, v in asdict(res).items() if k not in ("board", "update")}


def _why(exc: BaseException | None) -> str:
    if exc is None:
        return "no result (the round's wait ended first)"
    return f"{type(exc).__name__}: {exc}"[:400]
