"""Flow ``odl``: export -> artifacts -> validate -> deploy -> train on the board -> retrieve -> evaluate -> promote.

The flow only composes the Prefect tasks of :mod:`tasks.prefect.tasks`. One job per board at a time
through the global concurrency limit ``board-<name>``; the board job id derives from the flow run
id, so a retried flow run reattaches to its job instead of starting another.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run
from pydantic import BaseModel, Field

from tasks.judge.registry import Registry, decision_from_dict
from tasks.judge.report import ReportInput, epoch_table, render_report, report_key, step_losses, summary_text
from tasks.paths import PROJECT_ROOT, state_dir
from tasks.prefect import tasks as pt
from tasks.recipe.load import load_recipe, recipe_hash

log = logging.getLogger(__name__)


class OdlParams(BaseModel):
    """Parameters of a run (the form the Prefect UI shows for deployment ``odl/full``)."""

    recipe: str = Field(
        "recipes/digits.toml", description="recipe TOML, relative to the project root or absolute"
    )
    board: str = Field(
        "vboard", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$", description="board name in the inventory"
    )
    epochs: int | None = Field(None, ge=1, le=10000, description="override [training].epochs")
    batch_size: int | None = Field(None, ge=1, le=4096, description="override [training].batch_size")
    lr: float | None = Field(None, gt=0, lt=10, description="override [optimizer].lr")
    promotion_min_gain: float | None = Field(None, description="override [promotion].min_gain")
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

    def recipe_path(self) -> str:
        """The recipe path made absolute against the project root."""
        path = Path(self.recipe)
        return str(path if path.is_absolute() else PROJECT_ROOT / path)


def ensure_board_limit(board: str) -> str:
    """Create the global concurrency limit ``board-<name>`` (1 slot) if it does not exist."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    name = f"board-{board}"
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass
    return name


def _prepare(p: OdlParams, timings: dict[str, float]) -> tuple[Any, Path, dict[str, str]]:
    recipe_path = p.recipe_path()
    # promotion overrides do not change what is built: keep them out of the cached stages' inputs
    overrides = {k: v for k, v in p.recipe_overrides().items() if not k.startswith("promotion.")}
    _, timings["prepare data"] = pt.timed(pt.data_task, recipe_path, overrides)
    recipe = load_recipe(recipe_path, overrides)
    hashes = pt.input_hashes(recipe)
    work = state_dir("work", f"{recipe.name}-{recipe_hash(recipe)[:12]}")
    model, timings["export"] = pt.timed(pt.export_task, recipe_path, overrides, hashes, str(work))
    if not Path(model).is_file():  # a cached result whose folder was removed: redo it
        model = pt.export_task.with_options(refresh_cache=True)(recipe_path, overrides, hashes, str(work))
    _, timings["generate artifacts"] = pt.timed(
        pt.artifacts_task, recipe_path, overrides, hashes, str(work), pt.file_sha256(model)
    )
    _, timings["validate recipe"] = pt.timed(
        pt.validate_task, recipe_path, overrides, hashes, str(work), pt.manifest_sha(work)
    )
    return recipe, work, hashes


def _board_job(
    recipe: Any, work: Path, board: str, job_id: str, timings: dict[str, float]
) -> tuple[dict, str]:
    from tasks.prepare.jobspec import build_job_spec

    spec, files = build_job_spec(recipe, pt.prepared_in(work), job_id)
    paths = {sha: str(p) for sha, p in files.items()}
    with concurrency(ensure_board_limit(board), occupy=1, strict=True):
        deployed, timings[f"deploy to {board}"] = pt.timed(
            pt.deploy_task, board, spec.memory_estimate_mb, paths
        )
        get_run_logger().info(
            "deploy to %s: %d blob(s) uploaded, %d already there",
            board,
            deployed["uploaded"],
            deployed["skipped"],
        )
        trained, timings[f"train on {board}"] = pt.timed(
            pt.train_task, board, spec.to_json(), paths, report_key(recipe.name, board, "progress")
        )
        model, timings["retrieve"] = pt.timed(
            pt.retrieve_task, board, job_id, trained["result"], str(state_dir("runs", job_id))
        )
    return trained, model


@flow(name="odl", log_prints=False)
def odl(params: OdlParams | None = None) -> dict[str, Any]:
    """Retrain a recipe's model on a board and promote it in the local registry if it is better."""
    from device_agent.protocol import Event

    p = params or OdlParams()
    run_id = str(flow_run.get_id() or f"local-{int(time.time())}")
    job_id = f"odl-{run_id}"
    timings: dict[str, float] = {}
    _, work, hashes = _prepare(p, timings)
    recipe = load_recipe(p.recipe_path(), p.recipe_overrides())
    trained, model = _board_job(recipe, work, p.board, job_id, timings)
    registry_root = str(state_dir("registry"))
    current = Registry(Path(registry_root)).current(recipe.name, p.board)
    evals, timings["evaluate"] = pt.timed(
        pt.evaluate_task,
        p.recipe_path(),
        p.recipe_overrides(),
        str(work),
        model,
        str(current.model) if current else None,
    )
    info = {
        "flow_run_id": run_id,
        "job_id": job_id,
        "recipe_hash": recipe_hash(recipe),
        "input_hashes": hashes,
    }
    rule = {"metric": recipe.promotion.metric, "min_gain": recipe.promotion.min_gain}
    promoted, timings["promote"] = pt.timed(
        pt.promote_task,
        recipe.name,
        p.board,
        rule,
        evals["test"],
        model,
        str(work / "manifest.json"),
        info,
        registry_root,
    )
    result = trained["result"]
    events = [Event(type=e["type"], job_id=job_id, seq=e["seq"], data=e["data"]) for e in trained["events"]]
    inp = ReportInput(
        recipe=recipe.name,
        board=p.board,
        flow_run_id=run_id,
        job_id=job_id,
        test_set=recipe.data.test.name,
        evaluations=_columns(evals["test"], current),
        decision=decision_from_dict(promoted["decision"]),
        version=promoted["version"],
        extra_tests={k: _columns(v, current) for k, v in evals.items() if k != "test"},
        history=result.get("history", []),
        step_losses=step_losses(events),
        timings=timings,
        training={
            k: result[k] for k in ("steps", "epochs_done", "duration_s", "train_loop_s", "peak_rss_mb")
        },
    )
    return _publish(inp, recipe.name, p.board)


def _columns(evals: dict[str, Any], current: Any) -> dict[str, Any]:
    names = {
        "base": "base",
        "current": f"current ({current.name})" if current else "current",
        "candidate": "candidate",
    }
    return {names[k]: v for k, v in evals.items()}


def _publish(inp: ReportInput, recipe: str, board: str) -> dict[str, Any]:
    markdown = render_report(inp)
    summary = summary_text(inp)
    create_markdown_artifact(
        markdown, key=report_key(recipe, board), description=f"ODL report {recipe} on {board}"
    )
    create_table_artifact(
        epoch_table(inp.history),
        key=report_key(recipe, board, "epochs"),
        description="per-epoch metrics from the board",
    )
    folder = state_dir("reports", f"{recipe}-{board}")
    (folder / "latest.md").write_text(markdown)
    (folder / "latest.txt").write_text(summary + "\n")
    get_run_logger().info("summary:\n%s", summary)
    return {
        "summary": summary,
        "promoted": inp.decision.promote,
        "version": inp.version,
        "timings": inp.timings,
        "metrics": inp.evaluations,
    }
