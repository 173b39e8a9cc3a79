"""The fleet flow (deployment ``odl/fleet``): federated averaging rounds over a group of boards.

Prefect names a deployment ``<flow name>/<deployment name>``, so for ``prefect deployment run
odl/fleet`` this flow is registered under the pipeline's flow name ``odl`` (beside ``odl/full``);
its runs are named ``fleet-<group>-...`` so the runs list tells them apart.

Each round runs its boards in at most 16 waves (:mod:`tasks.fleet.waves`): one Prefect task a wave,
a thread a board in it (the boards' concurrency slots ``board-<name>`` still hold one job per board),
waits for them, and goes on with the boards that
finished: a board that fails or misses the round's deadline is reported, and the round fails only
below the quorum ``fleet.min_boards``. The aggregate after the last round is judged like any
candidate (the gate, the registry under the group's name) and, if promoted, installed on the
boards that took part in the last round.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.futures import wait
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from tasks import stages
from tasks.board.inventory import BOARD_NAME_PATTERN, Board, get_group, load_inventory
from tasks.fleet import waves
from tasks.fleet.buffered import BufferedRun
from tasks.fleet.rounds import FleetRun, check_fleet
from tasks.judge.decision import headline, verdict_message
from tasks.judge.report import report_key
from tasks.judge.report_gate import gate_md
from tasks.prefect import boards as boards_overview
from tasks.prefect import fleet as ft
from tasks.prefect import tasks as pt
from tasks.prefect.buffered import run_buffered
from tasks.prefect.fanout import fan_out_round
from tasks.prefect.logs import quiet_user_errors
from tasks.prefect.params import StrictParams, flow_run_name, parameter, run_tags, tag_run
from tasks.prefect.verdict import verdict_state
from tasks.prepare import Prepared
from tasks.recipe.extras import BufferSize, DeadlineS, FleetMode, FleetStrategy, MinBoards, Rounds
from tasks.recipe.load import load_recipe
from tasks.recipe.training import Epochs, LearningRate

log = logging.getLogger(__name__)
quiet_user_errors()  # our errors: one ERROR line in the run's logs, the traceback at DEBUG


class FleetParams(StrictParams):
    """Parameters of a fleet run (the form the Prefect UI shows for deployment ``odl/fleet``)."""

    recipe: str = Field("recipes/digits_fleet.toml", description="recipe TOML (relative to the project root)")
    group: str = Field(
        "lab", pattern=BOARD_NAME_PATTERN, description="board group of the inventory's [groups]"
    )
    rounds: Rounds | None = Field(None, description="override [fleet].rounds")
    min_boards: MinBoards | None = Field(None, description="override [fleet].min_boards (the quorum)")
    deadline_s: DeadlineS | None = Field(None, description="override [fleet].deadline_s (per round)")
    strategy: FleetStrategy | None = Field(None, description="override [fleet].strategy")
    mode: FleetMode | None = Field(None, description="override [fleet].mode (rounds | buffered)")
    buffer_size: BufferSize | None = Field(None, description="override [fleet].buffer_size (buffered)")
    epochs: Epochs | None = Field(None, description="override [training].epochs (local, per round)")
    lr: LearningRate | None = Field(None, description="override [optimizer].lr")
    overrides: dict[str, Any] = Field(default_factory=dict, description="more dotted-key recipe overrides")
    fanout: int | None = Field(
        None, ge=1, description="rounds mode: each round as this many odl/fleet-group runs on the pool"
    )

    def recipe_overrides(self) -> dict[str, Any]:
        named = {
            "fleet.rounds": self.rounds,
            "fleet.min_boards": self.min_boards,
            "fleet.deadline_s": self.deadline_s,
            "fleet.strategy": self.strategy,
            "fleet.mode": self.mode,
            "fleet.buffer_size": self.buffer_size,
            "training.epochs": self.epochs,
            "optimizer.lr": self.lr,
        }
        return {**self.overrides, **{k: v for k, v in named.items() if v is not None}}


# the flow's default (a run without parameters); never changed in place
DEFAULT_PARAMS = FleetParams()


@dataclass(frozen=True)
class FleetOutcome:
    """What a fleet run did: the round records, the verdict and the registry version."""

    summary: dict[str, Any]
    promoted: bool
    version: str
    reason: str


def _run_name() -> str:
    """``<recipe>@<group> <local time>``: as ``odl watch`` named it at creation, else at its scheduled start."""
    defaults = FleetParams()
    recipe = Path(parameter("recipe", defaults.recipe)).expanduser()
    return flow_run_name(
        recipe if recipe.is_absolute() else Path.cwd() / recipe, parameter("group", defaults.group)
    )


@flow(
    name="odl",
    flow_run_name=_run_name,
    log_prints=False,
    task_runner=ThreadPoolTaskRunner(max_workers=16),
)
def odl_fleet(params: FleetParams = DEFAULT_PARAMS) -> FleetOutcome | None:
    """Federated rounds over a board group; the final aggregate goes through the promotion gate."""
    # not Optional: a None branch makes the deployment's stored schema an anyOf, whose refusal of a
    # mistyped key names neither the key nor the known ones
    p = params
    run_id = str(flow_run.get_id() or f"local-{int(time.time())}")
    recipe = load_recipe(Path(p.recipe).expanduser().resolve(), p.recipe_overrides())
    boards = get_group(p.group)
    tag_run(run_tags(Path(p.recipe).expanduser().resolve(), p.group, "fleet", fleet=True))
    check_fleet(recipe, boards)  # bad input stops here, before anything is built or sent
    pt.prepare_data(recipe)
    inp = stages.inputs(recipe)
    pt.prepare_steps(inp)
    prep = stages.prepared(inp)
    warm = pt.warm_start(recipe, prep, p.group) if recipe.training.start_from == "current" else None
    kind = BufferedRun if recipe.fleet.mode == "buffered" else FleetRun
    fleet = kind.start_run(
        inp, prep, p.group, boards, run_id, warm.checkpoint if warm else None, warm.record if warm else None
    )
    if isinstance(fleet, BufferedRun):  # FedBuff: every board trains on, aggregated every K arrivals
        run_buffered(fleet, boards, inp, prep)
    else:
        _run_rounds(fleet, boards, inp, prep, p)
    candidate = fleet.final_model()
    reference = stages.choose_reference(recipe.name, p.group)
    evaluation = pt.evaluate(recipe, prep, candidate, reference)
    last = _serving(fleet)
    summary = fleet.summary()
    info = {"flow_run_id": run_id, "input_key": inp.key, "fleet": summary, "start_from": fleet.start}
    if summary["privacy"] is not None:  # the registry entry states the ε the model was trained under
        info["privacy"] = summary["privacy"]
    promotion = pt.promote(recipe, p.group, evaluation, candidate, prep, info)
    decision = promotion.decision
    served = ""
    if decision.promote and recipe.promotion.rollout:
        for b in boards:
            if b.name in last:
                ft.rollout(b, recipe.name, promotion.version, p.group)
        served = f"; serving on {', '.join(last)}"
    verdict = _verdict(promotion, served)
    ft.publish_fleet(fleet.summary(), verdict, gate_md(decision))
    boards_overview.publish_overview(sorted(load_inventory()), stages.registry())  # outliers in view
    outcome = FleetOutcome(fleet.summary(), decision.promote, promotion.version, decision.reason)
    message = verdict_message(promotion.version, decision, served)
    report = f"the artifact {report_key(recipe.name, p.group, 'fleet')}"
    return verdict_state(outcome, decision.promote, message, report)


def _serving(fleet: FleetRun | BufferedRun) -> list[str]:
    """The boards the promoted model rolls out to: those of the last round (a board that dropped out
    may be down); in the buffered mode every board that sent an update (the last aggregation holds
    only K arrivals, and the run stopped the other boards' jobs, not the boards)."""
    if isinstance(fleet, BufferedRun):
        arrived = {b for rec in fleet.rounds for b in rec["took_part"]}
        return sorted(arrived)
    return fleet.rounds[-1]["took_part"]


def _run_rounds(
    fleet: FleetRun, boards: list[Board], inp: stages.Inputs, prep: Prepared, p: FleetParams
) -> None:
    """The synchronous rounds: every board from the round's global model, then the aggregate; with
    ``fanout``, the boards in groups run on the pool's hosts (:mod:`tasks.prefect.fanout`)."""
    spec = fleet.spec
    for r in range(1, spec.rounds + 1):
        if not fleet.budget_allows(r):  # the privacy budget: the round that would cross it is not run
            log.info("%s", fleet.stopped)
            break
        started = time.monotonic()
        deadline = time.time() + spec.deadline_s
        groups: dict[str, Any] = {}
        if p.fanout:
            recipe = Path(p.recipe).expanduser().resolve()
            results, runs = fan_out_round(fleet, boards, r, deadline, p.fanout, recipe, p.recipe_overrides())
            groups = {"groups": runs}
        else:
            ckpt = fleet.round_checkpoint(r)
            out = {b.name: fleet.folder / f"round-{r:03d}" / b.name for b in boards}
            parts = waves.waves(boards)
            futures = [
                ft.board_wave.submit(
                    part,
                    inp,
                    prep,
                    ckpt,
                    fleet.run_id,
                    r,
                    deadline,
                    {b.name: out[b.name] for b in part},
                    waves.label(part),
                )  # fmt: skip
                for part in parts
            ]
            wait(futures, timeout=spec.deadline_s + 120)
            results = {}
            for future, part in zip(futures, parts, strict=True):
                results.update(ft.wave_outcomes(future, part))
        try:
            ft.close_round(fleet, r, results, started, groups)
        finally:
            ft.publish_fleet(fleet.summary())
            ft.mark_boards(fleet.summary())


def _verdict(promotion: Any, served: str) -> str:
    head = "**Promoted**" if promotion.decision.promote else "**Not promoted**"
    return f"{head}: the final aggregate, recorded as `{promotion.version}`: {headline(promotion.decision)}{served}."


__all__ = ["FleetOutcome", "FleetParams", "odl_fleet"]
