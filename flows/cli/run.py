"""``odl run``, ``odl flow`` and ``odl evaluate``: a recipe trained on a board, and a model judged.

``odl run RECIPE --board NAME`` prepares -> deploys -> trains on the board -> retrieves, without
Prefect (:func:`tasks.stages.run.run_on_board`, the same stages as the flow). The job id is the
recipe name and the hash of the job's inputs, so re-running the same command reattaches to the job
already on the board. ``odl flow`` runs the whole Prefect flow ``odl`` in this process, evaluation
and promotion included; ``odl evaluate`` scores an inference model on a test set.
"""

from __future__ import annotations

import argparse
import json
import sys

from pydantic import ValidationError

from flows.cli.home import prefect_api
from flows.cli.progress import Bars
from tasks import stages
from tasks.board.inventory import get_board, valid_board_name
from tasks.errors import RecipeError
from tasks.judge.evaluate import evaluate, judged_as
from tasks.judge.losses import HostLoss, host_loss
from tasks.paths import PROJECT_ROOT
from tasks.prefect.progress import watch
from tasks.recipe.load import load_recipe, parse_override
from tasks.stages.run import run_on_board


def cmd_run(args: argparse.Namespace) -> int:
    """``odl run``: one job on a board with progress bars; prints its result and where it is."""
    overrides = dict(parse_override(text) for text in args.set or [])
    with Bars() as bars:
        summary = run_on_board(
            args.recipe,
            args.board,
            args.out,
            job=args.job_id,
            overrides=overrides,
            validate=not args.no_validate,
            observer=bars,
        )
    r = summary.training.result
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(r.metrics.items()))
    print(
        f"job {summary.job_id} on {summary.board}: {r.status}, {r.steps} steps, {r.epochs_done} epochs "
        f"in {r.duration_s:.1f} s; {metrics}"
    )
    d = summary.deployment
    print(f"uploaded {d.bytes_sent} bytes ({len(d.skipped)} blob(s) already on the board)")
    print(f"outputs in {summary.out_dir}")
    return 0


def cmd_flow(args: argparse.Namespace) -> int:
    """``odl flow``: the whole Prefect flow ``odl`` in this process, with progress bars."""
    valid_board_name(args.board)
    where = prefect_api()  # before Prefect is imported: it reads its settings once
    from flows.odl import OdlParams, odl  # imports Prefect: only now that prefect_api() set its settings

    recipe = (args.recipe or PROJECT_ROOT / "recipes" / "digits.toml").expanduser().resolve()
    try:
        params = OdlParams(
            recipe=str(recipe),
            board=args.board,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            promotion_min_gain=args.promotion_min_gain,
            overrides=dict(parse_override(text) for text in args.set or []),
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        flag = "--" + "-".join(map(str, err["loc"])).replace("_", "-")
        raise RecipeError(flag, err["msg"][0].lower() + err["msg"][1:], err.get("input")) from exc
    load_recipe(params.recipe_path(), params.recipe_overrides())  # bad input: one line, nothing started
    get_board(
        params.board
    )  # a board missing from this home: one line naming the home, before the flow starts
    print(f"flow run on {where}", file=sys.stderr)
    with Bars() as bars:
        watch(bars)
        try:
            outcome = odl(params)
        finally:
            watch(None)
    print(outcome.summary)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``odl evaluate``: metrics of an inference model on an npz test set (task and loss from a recipe)."""
    task, loss = args.task, HostLoss(args.loss) if args.loss else None
    detector: dict = {}
    if args.recipe is not None:
        recipe = load_recipe(args.recipe.expanduser().resolve())
        inp = stages.inputs(recipe)
        stages.prepare_data(recipe)
        stages.generate_artifacts(inp)  # reused when the recipe is already prepared
        prep = stages.prepared(inp)
        task, loss = recipe.task, host_loss(recipe, prep)
        # a detector decoded with the export's priors (COCO mAP), a segmentation by its [segmentation] table
        detector = judged_as(recipe, prep.priors)
    elif task == "keypoints":
        raise RecipeError("--recipe", "the keypoints recipe ([keypoints]: the keypoint count, OKS sigmas, "
                          "the targets' sigma) that --task keypoints is judged by", None)  # fmt: skip
    print(json.dumps(evaluate(args.model, args.test, task, loss=loss, **detector), indent=2))
    return 0
