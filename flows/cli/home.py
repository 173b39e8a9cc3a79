"""``odl stack`` and ``odl report``: what this ODL_HOME runs and keeps - the local Prefect stack's
services, the last run's report of a recipe+board.

These commands load no stage and no Prefect. :func:`prefect_api` also points an in-process flow run
(``odl flow``) at the stack before Prefect is imported.
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from device_agent.protocol import NAME
from tasks.errors import RegistryError
from tasks.paths import odl_home
from tasks.prefect.params import recipe_name
from tasks.stack import StackError, alerts, ownership, postgres, server
from tasks.stack.automations import install_automations
from tasks.stack.processes import running_pid


def cmd_stack(args: argparse.Namespace) -> int:
    """``odl stack up | down | status | deploy | env | notify``: the local Prefect stack of this ODL_HOME."""
    if args.action == "up":
        if args.workers < 1:
            raise StackError(f"--workers {args.workers}: at least one worker")
        port = args.port or ownership.choose_port()
        env = server.stack_env(port=port, db=args.db, pg_port=args.pg_port, host=args.host)
        pids = server.up(env, workers=args.workers)
        print(", ".join(f"{name} pid {pid}" for name, pid in pids.items()) + f"; database {database(env)}")
        print(f"UI: {env['PREFECT_API_URL'].removesuffix('/api')}   (stop with: odl stack down)")
        print(alerts.status_line(Path(env["ODL_HOME"])))
        return 0
    env = server.stack_env(port=args.port)  # the port, database and address up last used for this ODL_HOME
    if args.action == "notify":
        return notify(env, args)
    if args.action == "deploy":
        server.deploy(env)
        print("deployed deploy/prefect.yaml (odl/full)")
    elif args.action == "down":
        stopped = server.down()
        print("stopped: " + (", ".join(stopped) or "nothing was running"))
    elif args.action == "env":  # eval "$(odl stack env)": the prefect CLI then talks to this home's server
        for key in ("ODL_HOME", "PREFECT_HOME", "PREFECT_API_URL"):
            print(f"export {key}={shlex.quote(env[key])}")
    else:
        print(f"server: {env['PREFECT_API_URL'].removesuffix('/api')}")
        foreign = ownership.foreign_server(env)
        if foreign:
            print(foreign)
        print(f"database: {database(env)}")
        for name, pid in server.status().items():
            print(f"{name}: {'running, pid ' + str(pid) if pid else 'not running'}")
        print(alerts.status_line(Path(env["ODL_HOME"])))
    return 0


def notify(env: dict[str, str], args: argparse.Namespace) -> int:
    """``odl stack notify [--webhook URL | --block TYPE/NAME | --off]``: record where the automations'
    alerts go and, when this home's stack runs, re-install them now; prints where they go."""
    home = Path(env["ODL_HOME"])
    if args.webhook is not None or args.block is not None or args.off:
        alerts.record(home, webhook=args.webhook, block=args.block)
        if ownership.is_ours(env):
            target = install_automations(env)
            if target.block_id is None and not args.off:
                raise StackError(alerts.line(target))
    print(alerts.status_line(home))
    return 0


def database(env: dict[str, str]) -> str:
    """The stack's database backend, for ``odl stack up``, ``odl stack status`` and ``odl flow``."""
    if env["ODL_STACK_DB"] == "sqlite":
        return f"sqlite ({env['PREFECT_HOME']}/prefect.db)"
    cluster = postgres.cluster_dir(Path(env["ODL_HOME"]))
    return f"postgres (PostgreSQL on 127.0.0.1:{env['ODL_PG_PORT']}, cluster {cluster})"


def prefect_api() -> str:
    """Point this process at the local stack's server when it runs (the run shows in its UI), else
    at a temporary server on the stack's database; library defaults as the stack sets them. Call it
    before Prefect is imported (it reads its settings once); returns where runs go, for a message."""
    env = server.stack_env()
    for key in (
        "PREFECT_HOME",
        "PREFECT_SERVER_ANALYTICS_ENABLED",
        "DO_NOT_TRACK",
        "PREFECT_LOGGING_EXTRA_LOGGERS",
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT",
    ):
        os.environ.setdefault(key, env[key])
    # Prefect creates its home without parents: a new ODL home would print "Failed to create the Prefect home"
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    # a temporary server on a new database migrates it first: ~10 s here, more on a loaded machine
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if "PREFECT_API_URL" in os.environ:
        return os.environ["PREFECT_API_URL"]
    if ownership.is_ours(env):  # this home's stack, by its identity: never another checkout's server
        os.environ["PREFECT_API_URL"] = env["PREFECT_API_URL"]
        return f"the local stack's server ({env['PREFECT_API_URL'].removesuffix('/api')})"
    foreign = ownership.foreign_server(env)
    if foreign:
        print(foreign)
    db_url = env.get("PREFECT_API_DATABASE_CONNECTION_URL")
    if db_url and running_pid(Path(env["ODL_HOME"]), "postgres"):  # the stack's PostgreSQL
        os.environ.setdefault("PREFECT_API_DATABASE_CONNECTION_URL", db_url)
        return f"a temporary Prefect server (database: {database(env)}; `odl stack up` for the UI)"
    return f"a temporary Prefect server (database in {env['PREFECT_HOME']}; `odl stack up` for the UI)"


def report_names(recipe: str, board: str) -> tuple[str, str]:
    """The recipe's name (``recipe``, or the ``name`` a ``.toml`` file declares) and the board's,
    checked by the one name rule before they name a folder of the project home (RegistryError)."""
    source = recipe if recipe.endswith(".toml") else ""
    name = recipe_name(recipe) if source else recipe
    name = NAME.check(name, "recipe", source=source, entry="name", error=RegistryError)
    return name, NAME.check(board, "board", error=RegistryError)


def cmd_report(args: argparse.Namespace) -> int:
    """``odl report``: the summary (or ``--markdown``: the whole report) of the last run of a recipe+board."""
    recipe, board = report_names(args.recipe, args.board)
    folder = odl_home() / "reports" / f"{recipe}-{board}"
    path = folder / ("latest.md" if args.markdown else "latest.txt")
    if not path.is_file():
        known = sorted(p.name for p in (odl_home() / "reports").glob("*-*") if p.is_dir())
        print(f"no report of {recipe} on {board} yet (reports are kept under a recipe's `name`, "
              f"then the board: {', '.join(known) or 'none yet'})")  # fmt: skip
        return 1
    print(path.read_text())
    return 0
