"""The run's report in the Prefect UI (markdown and per-epoch table artifacts, one key per
recipe+board so nightly runs line up as versions) and in ``$ODL_HOME/reports/<recipe>-<board>/``."""

from __future__ import annotations

import time
from typing import Any

from tasks import stages
from tasks.errors import RegistryError
from tasks.judge.continual import night_rows
from tasks.judge.report import ReportInput, epoch_table, render_report, report_key, step_losses, summary_text
from tasks.judge.trend import trend_points
from tasks.paths import state_dir
from tasks.prefect import boards
from tasks.recipe.schema import Recipe

TRAINING_FIELDS = ("steps", "epochs_done", "duration_s", "train_loop_s", "peak_rss_mb")
BOARD_FIELDS = {"machine": "board machine", "onnxruntime": "onnxruntime"}  # of the result's versions


def _columns(sets: dict[str, dict[str, Any]], reference: stages.Reference) -> dict[str, Any]:
    """Column names as the report shows them ("current (v0003)")."""
    label = {"current": f"current ({reference.name})" if reference.model else "current"}
    return {label.get(col, col): metrics for col, metrics in sets.items()}


def trend(recipe: str, board: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The promoted metric across the registry's versions of recipe+board (the candidate just
    recorded included) and the continual-learning rows of the nights with held-out figures; an
    unreadable registry or malformed version info raises RegistryError."""
    reg = stages.registry()
    try:
        current = reg.current(recipe, board)
        versions = reg.versions(recipe, board)
        return trend_points(versions, current.name if current else None), night_rows(versions)
    except (OSError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise RegistryError(
            f"registry {reg!r}: cannot read the versions of {recipe} on {board} ({exc})"
        ) from exc


def report_input(
    recipe: Recipe,
    board: str,
    run_id: str,
    training: stages.Training,
    evaluation: stages.Evaluation,
    promotion: stages.Promotion,
    timings: dict[str, float],
    lineage: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> ReportInput:
    """Everything the report shows, from the stages' typed results (called after the promotion
    is recorded, so the registry's trend includes this run's version); ``warnings``: preparation's
    (:func:`tasks.judge.report.preparation_warnings`)."""
    result = training.result.to_dict()
    ref = evaluation.reference
    points, nights = trend(recipe.name, board)
    return ReportInput(
        recipe=recipe.name,
        board=board,
        flow_run_id=run_id,
        job_id=training.job_id,
        test_set=recipe.data.test.name,
        test_path=recipe.data.test,
        int8=evaluation.int8,
        evaluations=_columns(evaluation.test, ref),
        decision=promotion.decision,
        version=promotion.version,
        extra_tests={k: _columns(v, ref) for k, v in evaluation.sets.items() if k != "test"},
        history=result.get("history", []),
        step_losses=step_losses(training.events),
        timings=timings,
        training={k: result[k] for k in TRAINING_FIELDS if k in result} | board_versions(result),
        trend=points,
        continual=nights,
        lineage=lineage or {},
        teacher=result.get("teacher") or {},
        warnings=list(warnings or []),
        events_url=boards.events_link(board, time.time()),
    )


def board_versions(result: dict[str, Any]) -> dict[str, str]:
    """What the board trained on, from the job's result: its machine (aarch64, x86_64) and onnxruntime
    version, as the report's training section names them (an agent that sent none: nothing)."""
    vers = result.get("versions") or {}
    return {label: str(vers[key]) for key, label in BOARD_FIELDS.items() if vers.get(key)}


def publish(inp: ReportInput) -> tuple[str, str]:
    """Create the report artifacts, keep a copy under ``$ODL_HOME/reports``; returns the summary and
    where the report is (its page in the UI when the server has one, else the file)."""
    from prefect import get_run_logger  # Prefect only inside a flow run
    from prefect.artifacts import (  # Prefect only inside a flow run
        create_markdown_artifact,
        create_table_artifact,
    )

    markdown, summary = render_report(inp), summary_text(inp)
    artifact = create_markdown_artifact(
        markdown, key=report_key(inp.recipe, inp.board), description=f"ODL report {inp.recipe} on {inp.board}"
    )
    create_table_artifact(
        epoch_table(inp.history),
        key=report_key(inp.recipe, inp.board, "epochs"),
        description="per-epoch metrics from the board",
    )
    folder = state_dir("reports", f"{inp.recipe}-{inp.board}")
    (folder / "latest.md").write_text(markdown)
    (folder / "latest.txt").write_text(summary + "\n")
    get_run_logger().info("summary:\n%s", summary)
    ui = boards.ui_url()
    return summary, f"{ui}/artifacts/artifact/{artifact}" if ui else str(folder / "latest.md")
