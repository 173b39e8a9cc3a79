"""The arguments of every ``odl`` command, and which command module runs each.

This module imports only argparse and pathlib, so ``odl --help`` (and a usage error) costs no import of
the pipeline. Each command sets ``area`` (its module: ``flows.cli.<area>``, imported by the
dispatcher only when one of its commands runs) and ``handler`` (the function there that runs it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli.parser_board import add_board, add_endpoint
from flows.cli.parser_kit import Sub, command

STACK_ACTIONS = """The local Prefect stack of this ODL_HOME, one action at a time:

  up      start the Prefect server, the work pool odl-pool, the deployment odl/full
          and the worker(s); prints the UI's address (--port, --db, --workers, --host)
  down    stop the worker(s), the server and PostgreSQL if used; keeps every run's data,
          the registry and the reports
  status  the server's address and database, each service's pid, where alerts go
  deploy  create the work pool if missing and (re)deploy every deployment of
          deploy/prefect.yaml on the running server
  env     print `export PREFECT_API_URL=...` lines for this home's stack; eval them so
          the prefect CLI talks to it: eval "$(odl stack env)"
  notify  where the automations' alerts go: --webhook URL, --block TYPE/NAME or --off

example: odl stack up && odl watch odl/full && odl stack down"""

RUN_DESCRIPTION = """One training job on a board without Prefect: prepare the recipe (export, training
artifacts, offline validation), deploy the job, train on the board with progress bars and retrieve
the trained model into --out. It neither evaluates nor promotes: the registry is not touched (use
`odl flow` or `odl watch odl/full` for the whole pipeline, or `odl evaluate` on the model it retrieved).

example: odl run recipes/digits.toml --board vboard --set training.epochs=3"""


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="odl", description="On-device learning pipeline for STM32MP2 boards."
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, library messages and tracebacks"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (add_prepare, add_flow, add_hosts, add_board, add_endpoint, add_run, add_nightly, add_recipe):
        add(sub)
    _verbose_everywhere(sub)
    return parser


def add_prepare(sub: Sub) -> None:
    """``odl prepare | export | artifacts | validate``: the host's offline stages."""

    def add(name: str, help_text: str, handler: str) -> argparse.ArgumentParser:
        p = command(sub, name, "prepare", handler, help=help_text, description=help_text)
        p.add_argument("recipe", type=Path, help="recipe TOML file")
        p.add_argument("--out", type=Path, required=True, help="output folder")
        p.add_argument(
            "--set", action="append", metavar="KEY=VALUE", help="override a recipe field (TOML value)"
        )
        return p

    p = add("prepare", "export, generate training artifacts and validate a recipe", "cmd_prepare")
    p.add_argument("--no-validate", action="store_true", help="skip the offline validation")
    add("export", "export the recipe's model to OUT/model.onnx (training mode)", "cmd_export")
    p = add(
        "artifacts", "generate the recipe runtime's training artifacts and manifest.json", "cmd_artifacts"
    )
    p.add_argument("--model", type=Path, required=True, help="the exported model.onnx")
    p = add("validate", "validate prepared artifacts offline (writes validation.json)", "cmd_validate")
    p.add_argument("--steps", type=int, default=5, help="training steps of the probe")


def add_flow(sub: Sub) -> None:
    """``odl stack | flow | evaluate | registry | report`` (areas ``home``, ``run`` and ``nightly``)."""
    stack = command(sub, "stack", "home", "cmd_stack", help="local Prefect server + work pool + deployment + worker(s)",
                     description=STACK_ACTIONS, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    stack.add_argument("action", choices=["up", "down", "status", "deploy", "env", "notify"],
                       help="what to do (each action is described above)")  # fmt: skip
    stack.add_argument(
        "--port",
        type=int,
        default=None,
        help="server port (default: the one this ODL_HOME's stack last used, else 4200 if free, else any free port)",
    )
    stack.add_argument("--db", choices=["sqlite", "postgres"],
                       help="up: the server's database (default: the one up last used here, else sqlite)")  # fmt: skip
    stack.add_argument("--workers", type=int, default=1, help="up: process workers on odl-pool (default 1)")
    stack.add_argument("--pg-port", type=int, help="up: PostgreSQL port (default: as last time, else 5433)")
    stack.add_argument("--host", help="up: address the server listens on (default: as last time, else "
                       "127.0.0.1; a private address for workers on other hosts, see deploy/MULTIHOST.md)")  # fmt: skip
    alert = stack.add_mutually_exclusive_group()
    alert.add_argument("--webhook", metavar="URL", help="notify: POST each alert as JSON {subject, body} to URL "
                       "(kept in the home's stack.json; ODL_ALERT_WEBHOOK does the same at up)")  # fmt: skip
    alert.add_argument("--block", metavar="TYPE/NAME", help="notify: send alerts through an existing Prefect "
                       "notification block, e.g. slack-webhook/team (made in the UI's Blocks page)")  # fmt: skip
    alert.add_argument("--off", action="store_true", help="notify: alerts go nowhere again")

    run = command(sub, "flow", "run", "cmd_flow",
                   help="run the whole Prefect flow odl (evaluation and promotion included) in this process")  # fmt: skip
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

    ev = command(sub, "evaluate", "run", "cmd_evaluate",
                  help="evaluate an inference ONNX model on an npz test set")  # fmt: skip
    ev.add_argument("model", type=Path)
    ev.add_argument("test", type=Path)
    ev.add_argument("--task", default="classification")
    ev.add_argument("--loss", choices=("mse", "l1", "cross-entropy", "bce-with-logits"),
                    help="the loss to report (default: the task's usual one)")  # fmt: skip
    ev.add_argument("--recipe", type=Path, help="take task and loss from this prepared recipe "
                    "(custom and embedded losses are run by its eval graph)")  # fmt: skip

    reg = command(sub, "registry", "nightly", "cmd_registry",
                   help="list the versions of a recipe+board in the model registry")  # fmt: skip
    reg.add_argument("recipe")
    reg.add_argument("board", nargs="?", default="vboard")

    watch = command(sub, "watch", "watch", "cmd_watch",
                     help="start a deployment run and follow it in a few lines (stages, training, verdict)")  # fmt: skip
    watch.add_argument("deployment", nargs="?", default="odl/full", help="deployment (default odl/full)")
    watch.add_argument(
        "--params", default="{}", help='the run\'s params as JSON, e.g. \'{"board": "vboard"}\''
    )
    watch.add_argument("--recipe", default="recipes/digits.toml", help="the recipe when params names none")
    watch.add_argument(
        "--kind", default="full", choices=["full", "nightly", "fleet"], help="the run's kind tag"
    )
    watch.add_argument("--timeout", type=float, default=1800.0, help="seconds to follow the run")

    rep = command(sub, "report", "home", "cmd_report",
                   help="print the summary of the last run of a recipe+board")  # fmt: skip
    rep.add_argument("recipe", help="the recipe's name (or its .toml file)")
    rep.add_argument("board", nargs="?", default="vboard")
    rep.add_argument("--markdown", action="store_true", help="print the whole markdown report")


def add_hosts(sub: Sub) -> None:
    """``odl hosts up | down | status | sync``: simulated worker hosts on this machine (issue 45)."""
    hosts = command(sub, "hosts", "hosts", "cmd_hosts",
                     help="simulated worker hosts: own netns and ODL_HOME, a worker each on odl-pool")  # fmt: skip
    hosts.add_argument("action", choices=["up", "down", "status", "sync"],
                       help="sync: copy the boards (inventory, keys, host keys) to the hosts again and catch them up "
                       "with the shared store")  # fmt: skip
    hosts.add_argument("--hosts", type=int, default=2, help="up: how many hosts, h1..hN (default 2)")
    hosts.add_argument("--cpu-quota", type=float, metavar="CPUS", help="up: cap each host's CPU (cgroup)")
    hosts.add_argument("--limit", type=int, default=1, help="up: flow runs at a time per host (default 1)")
    hosts.add_argument("--no-netns", action="store_true", help="up: on this machine's network")


def add_run(sub: Sub) -> None:
    """``odl run``: prepare, deploy, train on a board and retrieve, without Prefect."""
    p = command(sub, "run", "run", "cmd_run", help="prepare, deploy, train on a board and retrieve (no Prefect)",
                 description=RUN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("recipe", type=Path, help="recipe TOML file (relative to the current folder)")
    p.add_argument("--board", required=True, help="board name in the inventory")
    p.add_argument("--out", type=Path, help="output folder (default $ODL_HOME/runs/JOB_ID)")
    p.add_argument("--job-id", help="job id (default: recipe name + hash of the job's inputs)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe field (TOML value)")
    p.add_argument("--no-validate", action="store_true", help="skip the host dry-run of the recipe")


def add_nightly(sub: Sub) -> None:
    """``odl rollout | rollback | models | data push | data list``."""
    out = command(sub, "rollout", "nightly", "cmd_rollout",
                   help="install a registry version as the board's current model")  # fmt: skip
    out.add_argument("recipe")
    out.add_argument("board")
    out.add_argument("--version", help="a registry version (default: the registry's current)")
    back = command(sub, "rollback", "nightly", "cmd_rollback",
                    help="serve the previous version again (board and registry)")  # fmt: skip
    back.add_argument("recipe")
    back.add_argument("board")
    models = command(sub, "models", "nightly", "cmd_models",
                      help="the model the board serves for a recipe, and the registry's current version")  # fmt: skip
    models.add_argument("recipe")
    models.add_argument("board")
    models.add_argument("--json", action="store_true", help="the board's answer as JSON")
    data = sub.add_parser("data", help="a board dataset folder: push files to it, list it")
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    push = command(dsub, "push", "nightly", "cmd_push",
                    help="append files to a board dataset folder (atomic renames)")  # fmt: skip
    push.add_argument("board")
    push.add_argument("files", nargs="+", type=Path)
    push.add_argument("--to", required=True, help="the folder on the board, e.g. datasets/digits")
    lst = command(dsub, "list", "nightly", "cmd_list", help="the folder's files with sha256 and samples")
    lst.add_argument("board")
    lst.add_argument("path")
    lst.add_argument("--format", default="npz-shards", choices=("npz-shards", "image-folder"))


def add_recipe(sub: Sub) -> None:
    """``odl recipe schema``: the recipe's JSON Schema for editors."""
    recipe = sub.add_parser("recipe", help="the recipe format: its JSON Schema for editors")
    rsub = recipe.add_subparsers(dest="recipe_command", required=True, metavar="ACTION")
    schema = command(rsub, "schema", "recipe", "cmd_schema",
                      help="write the recipe's JSON Schema (Taplo / Even Better TOML check recipes with it)")  # fmt: skip
    schema.add_argument("--out", type=Path, help="the file to write (default: stdout)")


def _verbose_everywhere(sub: Sub) -> None:
    """Accept ``-v`` after the subcommand too (``odl flow RECIPE -v``)."""
    for parser in sub.choices.values():
        parser.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _verbose_everywhere(action)
