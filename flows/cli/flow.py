"""``odl stack``, ``odl flow``, ``odl evaluate``, ``odl registry`` and ``odl report`` subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tasks.paths import odl_home


def register(sub: argparse._SubParsersAction) -> None:
    """Add the flow-area subcommands to the ``odl`` parser."""
    stack = sub.add_parser("stack", help="local Prefect server + work pool + deployment + worker(s)")
    stack.add_argument("action", choices=["up", "down", "status", "deploy"])
    stack.add_argument("--port", type=int, default=4200, help="server port (default 4200)")
    stack.add_argument("--db", choices=["sqlite", "postgres"],
                       help="up: the server's database (default: the one up last used here, else sqlite)")  # fmt: skip
    stack.add_argument("--workers", type=int, default=1, help="up: process workers on odl-pool (default 1)")
    stack.add_argument("--pg-port", type=int, help="up: PostgreSQL port (default: as last time, else 5433)")
    stack.add_argument("--host", help="up: address the server listens on (default: as last time, else "
                       "127.0.0.1; a private address for workers on other hosts, see deploy/MULTIHOST.md)")  # fmt: skip
    stack.set_defaults(func=_stack)

    run = sub.add_parser(
        "flow", help="run the whole Prefect flow odl (evaluation and promotion included) in this process"
    )
    run.add_argument(
        "recipe",
        nargs="?",
        type=Path,
        help="recipe TOML, relative to the current folder (default: the digits demo)",
    )
    run.add_argument("--board", default="vboard", help="board name in the inventory (default vboard)")
    run.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a recipe field (TOML value)"
    )
    run.add_argument("--epochs", type=int)
    run.add_argument("--batch-size", type=int)
    run.add_argument("--lr", type=float)
    run.add_argument("--min-gain", type=float, dest="promotion_min_gain")
    run.set_defaults(func=_run)

    ev = sub.add_parser("evaluate", help="evaluate an inference ONNX model on an npz test set")
    ev.add_argument("model", type=Path)
    ev.add_argument("test", type=Path)
    ev.add_argument("--task", default="classification")
    ev.add_argument("--loss", choices=("mse", "l1", "cross-entropy", "bce-with-logits"),
                    help="the loss to report (default: the task's usual one)")  # fmt: skip
    ev.add_argument("--recipe", type=Path, help="take task and loss from this prepared recipe "
                    "(custom and embedded losses are run by its eval graph)")  # fmt: skip
    ev.set_defaults(func=_evaluate)

    reg = sub.add_parser("registry", help="list the versions of a recipe+board in the model registry")
    reg.add_argument("recipe")
    reg.add_argument("board", nargs="?", default="vboard")
    reg.set_defaults(func=_registry)

    rep = sub.add_parser("report", help="print the summary of the last run of a recipe+board")
    rep.add_argument("recipe")
    rep.add_argument("board", nargs="?", default="vboard")
    rep.add_argument("--markdown", action="store_true", help="print the whole markdown report")
    rep.set_defaults(func=_report)


def _stack(args: argparse.Namespace) -> int:
    from flows import stack

    if args.action == "up":
        if args.workers < 1:
            raise stack.StackError(f"--workers {args.workers}: at least one worker")
        env = stack.stack_env(port=args.port, db=args.db, pg_port=args.pg_port, host=args.host)
        pids = stack.up(env, workers=args.workers)
        print(", ".join(f"{name} pid {pid}" for name, pid in pids.items()) + f"; database {_database(env)}")
        print(f"UI: {env['PREFECT_API_URL'].removesuffix('/api')}   (stop with: odl stack down)")
        return 0
    env = stack.stack_env(port=args.port)  # the database and address up last used for this ODL_HOME
    if args.action == "deploy":
        stack.deploy(env)
        print("deployed deploy/prefect.yaml (odl/full)")
    elif args.action == "down":
        stopped = stack.down()
        print("stopped: " + (", ".join(stopped) or "nothing was running"))
    else:
        print(f"database: {_database(env)}")
        for name, pid in stack.status().items():
            print(f"{name}: {'running, pid ' + str(pid) if pid else 'not running'}")
    return 0


def _database(env: dict[str, str]) -> str:
    """The stack's database backend, for ``odl stack up`` and ``odl stack status``."""
    if env["ODL_STACK_DB"] == "sqlite":
        return f"sqlite ({env['PREFECT_HOME']}/prefect.db)"
    from flows import postgres

    cluster = postgres.cluster_dir(Path(env["ODL_HOME"]))
    return f"postgres (PostgreSQL on 127.0.0.1:{env['ODL_PG_PORT']}, cluster {cluster})"


def _run(args: argparse.Namespace) -> int:
    where = _prefect_api()  # before Prefect is imported: it reads its settings once
    from pydantic import ValidationError

    from flows.cli.progress import Bars
    from flows.odl import OdlParams, odl
    from tasks.board.inventory import get_board, valid_board_name
    from tasks.errors import RecipeError
    from tasks.paths import PROJECT_ROOT
    from tasks.prefect.progress import watch
    from tasks.recipe.load import load_recipe, parse_override

    recipe = (args.recipe or PROJECT_ROOT / "recipes" / "digits.toml").expanduser().resolve()
    valid_board_name(args.board)
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
    get_board(params.board)
    print(f"flow run on {where}", file=sys.stderr)
    with Bars() as bars:
        watch(bars)
        try:
            outcome = odl(params)
        finally:
            watch(None)
    print(outcome.summary)
    return 0


def _prefect_api() -> str:
    """Point this process at the local stack's server when it runs (the run shows in its UI), else
    at a temporary server on the stack's database; library defaults as the stack sets them."""
    from flows import stack

    env = stack.stack_env()
    for key in (
        "PREFECT_HOME",
        "PREFECT_SERVER_ANALYTICS_ENABLED",
        "DO_NOT_TRACK",
        "PREFECT_LOGGING_EXTRA_LOGGERS",
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT",
    ):
        os.environ.setdefault(key, env[key])
    # a temporary server on a new database migrates it first: ~10 s here, more on a loaded machine
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if "PREFECT_API_URL" in os.environ:
        return os.environ["PREFECT_API_URL"]
    if stack.api_healthy(env):
        os.environ["PREFECT_API_URL"] = env["PREFECT_API_URL"]
        return f"the local stack's server ({env['PREFECT_API_URL'].removesuffix('/api')})"
    db_url = env.get("PREFECT_API_DATABASE_CONNECTION_URL")
    if db_url and stack.running_pid(Path(env["ODL_HOME"]), "postgres"):  # the stack's PostgreSQL
        os.environ.setdefault("PREFECT_API_DATABASE_CONNECTION_URL", db_url)
        return f"a temporary Prefect server (database: {_database(env)}; `odl stack up` for the UI)"
    return f"a temporary Prefect server (database in {env['PREFECT_HOME']}; `odl stack up` for the UI)"


def _evaluate(args: argparse.Namespace) -> int:
    from tasks.judge.evaluate import evaluate
    from tasks.judge.losses import HostLoss, host_loss

    task, loss = args.task, HostLoss(args.loss) if args.loss else None
    detector: dict = {}
    if args.recipe is not None:
        from tasks import stages
        from tasks.recipe.load import load_recipe

        recipe = load_recipe(args.recipe.expanduser().resolve())
        inp = stages.inputs(recipe)
        stages.prepare_data(recipe)
        stages.generate_artifacts(inp)  # reused when the recipe is already prepared
        prep = stages.prepared(inp)
        task, loss = recipe.task, host_loss(recipe, prep)
        if recipe.detection is not None:  # decoded with the export's priors, scored with COCO mAP
            detector = {"detection": recipe.detection, "priors": prep.priors}
    print(json.dumps(evaluate(args.model, args.test, task, loss=loss, **detector), indent=2))
    return 0


def _registry(args: argparse.Namespace) -> int:
    from tasks.judge.registry import Registry

    reg = Registry(odl_home() / "registry")
    current = reg.current(args.recipe, args.board)
    for v in reg.versions(args.recipe, args.board):
        mark = "*" if current and v.name == current.name else " "
        verdict = "promoted" if v.promoted else "rejected"
        print(
            f"{mark} {v.name}  {verdict:<8}  run {v.info.get('flow_run_id', '-')}  {v.info.get('reason', '')}"
        )
    if current is None:
        print("(no current version)")
    return 0


def _report(args: argparse.Namespace) -> int:
    folder = odl_home() / "reports" / f"{args.recipe}-{args.board}"
    path = folder / ("latest.md" if args.markdown else "latest.txt")
    if not path.is_file():
        print(f"no report yet at {path}")
        return 1
    print(path.read_text())
    return 0
