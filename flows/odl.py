"""Flow ``odl``: export -> artifacts -> validate -> deploy -> train on the board -> retrieve -> evaluate -> promote.

The flow only composes the tasks of :mod:`tasks.prefect.tasks`, each a thin wrapper of a stage in
:mod:`tasks.stages` (the same functions ``odl run`` calls). One job per board at a time through the
global concurrency limit ``board-<name>``; the job id is the input hash plus the flow run id, so a
retried flow run reattaches to its job on the board instead of starting another.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run
from prefect.states import Completed
from pydantic import Field

from tasks import stages
from tasks.board.inventory import BOARD_NAME_PATTERN, get_board, load_inventory
from tasks.judge.decision import verdict_message
from tasks.judge.report import preparation_warnings, report_key
from tasks.paths import state_dir
from tasks.prefect import boards
from tasks.prefect import tasks as pt
from tasks.prefect.limits import ensure_board_limit
from tasks.prefect.logs import quiet_user_errors
from tasks.prefect.params import StrictParams, flow_run_name, parameter, run_tags, tag_run
from tasks.prefect.publish import publish, report_input
from tasks.prefect.verdict import verdict_state
from tasks.recipe.extras import MinGain
from tasks.recipe.load import load_recipe
from tasks.recipe.training import BatchSize, Epochs, LearningRate

log = logging.getLogger(__name__)
quiet_user_errors()  # our errors: one ERROR line in the run's logs, the traceback at DEBUG


class OdlParams(StrictParams):
    """Parameters of a run (the form the Prefect UI shows for deployment ``odl/full``)."""

    recipe: str = Field(
        "recipes/digits.toml",
        description="recipe TOML: absolute, or relative to the folder the flow runs in (the project root "
        "for deployment odl/full)",
    )
    board: str = Field("vboard", pattern=BOARD_NAME_PATTERN, description="board name in the inventory")
    epochs: Epochs | None = Field(None, description="override [training].epochs")
    batch_size: BatchSize | None = Field(None, description="override [training].batch_size")
    lr: LearningRate | None = Field(None, description="override [optimizer].lr")
    promotion_min_gain: MinGain | None = Field(None, description="override [promotion].min_gain")
    overrides: dict[str, Any] = Field(default_factory=dict, description="more dotted-key recipe overrides")

    def recipe_overrides(self) -> dict[str, Any]:
        """The dotted-key overrides these parameters apply to the recipe."""
        named = {
            "training.epochs": self.epochs,
            "training.batch_size": self.batch_size,
            "optimizer.lr": self.lr,
            "promotion.min_gain": self.promotion_min_gain,
        }
        return {**self.overrides, **{k: v for k, v in named.items() if v is not None}}

    def recipe_path(self) -> Path:
        """The recipe path, a relative one resolved against the current folder."""
        return Path(self.recipe).expanduser().resolve()


# the flow's default (a run without parameters); never changed in place
DEFAULT_PARAMS = OdlParams()


@dataclass(frozen=True)
class Outcome:
    """What one run of the flow did."""

    job_id: str
    run_dir: Path
    promoted: bool
    version: str
    summary: str
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # column -> metrics (test set)
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds


def _run_name() -> str:
    """``<recipe>@<board> <local time>``: as ``odl watch`` named it at creation, else at its scheduled start."""
    defaults = OdlParams()
    recipe = Path(parameter("recipe", defaults.recipe)).expanduser()
    return flow_run_name(
        recipe if recipe.is_absolute() else Path.cwd() / recipe, parameter("board", defaults.board)
    )


@flow(name="odl", flow_run_name=_run_name, log_prints=False)
def odl(params: OdlParams = DEFAULT_PARAMS) -> Outcome | None:
    """Retrain a recipe's model on a board and promote it in the local registry if it is better."""
    # not Optional: a None branch makes the deployment's stored schema an anyOf, whose refusal of a
    # mistyped key names neither the key nor the known ones
    p = params
    run_id = str(flow_run.get_id() or f"local-{int(time.time())}")
    t: dict[str, float] = {}
    recipe = load_recipe(p.recipe_path(), p.recipe_overrides())
    nightly = recipe.training.start_from == "current" or recipe.data.board_dataset is not None
    tag_run(run_tags(p.recipe_path(), p.board, "nightly" if nightly else "full"))
    board = get_board(p.board)
    _, t["prepare data"] = pt.timed(pt.prepare_data, recipe)
    inp = stages.inputs(recipe)
    t |= pt.prepare_steps(inp)  # export, generate artifacts, validate recipe: one model build
    prep = stages.prepared(inp)
    warm = None
    if recipe.training.start_from == "current":
        warm, t["warm start"] = pt.timed(pt.warm_start, recipe, prep, board.name)
    data = pt.board_data(recipe, board) if recipe.data.board_dataset else None
    if isinstance(data, str):  # a night without new data on the board: nothing to retrain
        tag_run(["no-new-data"])
        return Completed(data=None, message=f"No new data: {data}"[:500])
    extra = (warm.record["checkpoint_sha256"] if warm else "") + (_files_key(data) if data else "")
    spec, files = stages.job_spec(
        inp,
        prep,
        stages.job_id(inp, run_id, extra),
        checkpoint=warm.checkpoint if warm else None,
        train_data=data.ref if data else None,
    )
    run_dir = state_dir("runs", spec.job_id)
    # the slot's lease lapses when this process dies (SIGKILL), so a killed run frees the board
    lease = max(60.0, float(os.environ.get("ODL_BOARD_LEASE_S", "300")))  # Prefect's minimum is 60 s
    with concurrency(ensure_board_limit(board.name), occupy=1, strict=True, lease_duration=lease):
        _, t[f"deploy to {board.name}"] = pt.timed(pt.deploy, board, spec, files)
        progress_key = report_key(recipe.name, board.name, "progress")
        training, t[f"train on {board.name}"] = pt.timed(pt.train, board, spec, files, progress_key)
        got, t["retrieve"] = pt.timed(pt.retrieve, board, training, run_dir)
    reference = stages.choose_reference(recipe.name, board.name)
    learnt = data.record.get("learnt", []) if data else []
    evaluation, t["evaluate"] = pt.timed(pt.evaluate, recipe, prep, got.inference, reference, learnt)
    info = {
        "flow_run_id": run_id,
        "job_id": training.job_id,
        "input_key": inp.key,
        "input_hashes": inp.hashes,
        "start_from": warm.record if warm else {"from": "base"},
        "board_data": data.record if data else None,
    }
    promotion, t["promote"] = pt.timed(pt.promote, recipe, board.name, evaluation, got.inference, prep, info)
    served = ""
    if promotion.decision.promote and recipe.promotion.rollout:
        _, t[f"rollout to {board.name}"] = pt.timed(pt.rollout, board, recipe.name, promotion.version)
        served = f"; serving on {board.name} (models/{recipe.name}/current.onnx)"
    model = recipe.model  # what the first version starts from: a weights file, an ONNX file's own, or random
    weights = (
        model.weights.name if model.weights else (Path(model.ref).name if model.kind == "onnx" else None)
    )
    lineage = {**info, "rollout": served.removeprefix("; "), "weights": weights}
    warned = preparation_warnings(prep.manifest, prep.validation)
    summary, report = publish(
        report_input(recipe, board.name, run_id, training, evaluation, promotion, t, lineage, warned)
    )
    boards.publish_overview(sorted(load_inventory()), stages.registry())  # the fleet overview, refreshed
    test = evaluation.test
    outcome = Outcome(spec.job_id, run_dir, promotion.decision.promote, promotion.version, summary, test, t)
    message = verdict_message(promotion.version, promotion.decision, served)  # a headline, then what failed
    return verdict_state(outcome, promotion.decision.promote, message, report)


def _files_key(data: Any) -> str:
    """A hash of the pinned board files (their sha256 in order)."""
    return hashlib.sha256("".join(f["sha256"] for f in data.record["files"]).encode()).hexdigest()
