"""One group of a fanned-out fleet round (deployment ``odl/fleet-group``), on any host's worker.

The first host's fleet flow (:mod:`flows.fleet`, parameter ``fanout``) starts one run of this flow
per board group and round. It prepares the recipe in this host's own ``ODL_HOME`` (cached there
after the first round; with a shared store, fetched from it when another host prepared it), writes the round's global weights (its parameters) into the prepared
checkpoint, trains the group's boards as one wave of the one-host round (the Prefect task
:func:`tasks.prefect.fleet.board_wave`, holding the boards' server-wide concurrency slots: one job
per board across hosts) and sends the boards' updates back in its result record
(:mod:`tasks.fleet.fanout`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import Artifact
from prefect.futures import wait
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from tasks import stages
from tasks.board.inventory import get_board
from tasks.checkpoint import write_checkpoint
from tasks.fleet import fanout, waves
from tasks.paths import odl_home, state_dir
from tasks.prefect import fleet as ft
from tasks.prefect import tasks as pt
from tasks.prefect.logs import quiet_user_errors
from tasks.prefect.params import StrictParams
from tasks.recipe.load import load_recipe

quiet_user_errors()


class GroupParams(StrictParams):
    """What a group run needs (the first host's fleet flow fills them in)."""

    recipe: str = Field(..., description="recipe TOML (absolute, in the shared project checkout)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="the fleet run's recipe overrides")
    boards: list[str] = Field(..., min_length=1, description="the group's boards (this host's inventory)")
    run_id: str = Field(..., description="the fleet run's id (the boards' job ids)")
    round: int = Field(..., ge=1, description="the round")
    deadline_wall: float = Field(..., description="the round's deadline (seconds since the epoch)")
    weights: str = Field(
        ...,
        description="the round's global trainable weights: sha256:<hex> of the shared store's blob, or base64 .npz",
    )


def _run_name() -> str:
    params = (flow_run.parameters or {}).get("params") or {}
    get = params.get if isinstance(params, dict) else lambda key: getattr(params, key, None)
    boards = get("boards") or ["?"]
    return f"fleet-group r{get('round') or '?'} {boards[0]}..{boards[-1]} ({len(boards)})"


@flow(name="odl", flow_run_name=_run_name, log_prints=False, task_runner=ThreadPoolTaskRunner(max_workers=16))
def odl_fleet_group(params: GroupParams) -> dict[str, Any]:
    """Train the group's boards for one round from the given weights; their updates go back in an
    artifact of type ``odl-fleet-updates``; returns the count of updates and failures."""
    p = params
    recipe = load_recipe(Path(p.recipe), p.overrides)
    boards = [get_board(name) for name in p.boards]
    pt.prepare_data(recipe)
    inp = stages.inputs(recipe)
    pt.prepare_steps(inp)
    prep = stages.prepared(inp)
    tag = "".join(c for c in p.run_id if c.isalnum())[:12]
    folder = state_dir("fleet-groups", f"{recipe.name}-{tag}", f"round-{p.round:03d}-{p.boards[0]}")
    ckpt = write_checkpoint(prep.checkpoint, fanout.unpack_weights(p.weights, folder), folder / "global.ckpt")
    future = ft.board_wave.submit(boards, inp, prep, ckpt, p.run_id, p.round, p.deadline_wall,
                                  {b.name: folder / b.name for b in boards}, waves.label(boards))  # fmt: skip
    wait([future], timeout=max(0.0, p.deadline_wall - time.time()) + 120)
    host = odl_home().name
    items = [fanout.entry(name, res, host) for name, res in ft.wave_outcomes(future, boards).items()]
    Artifact(
        type=fanout.RESULT_TYPE, data=items, description=f"round {p.round}: updates of {', '.join(p.boards)}"
    ).create()
    done = sum("npz" in i for i in items)
    return {"host": host, "updates": done, "missing": len(items) - done}


__all__ = ["GroupParams", "odl_fleet_group"]
