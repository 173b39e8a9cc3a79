"""The first host's side of a fanned-out fleet round: start one ``odl/fleet-group`` run per board
group on the pool, wait for them, read back each board's update (:mod:`tasks.fleet.fanout`).

Returns what the one-host round returns (board name -> BoardUpdate, or the exception it ended
with), so :meth:`tasks.fleet.rounds.FleetRun.close_round` aggregates it unchanged; a group run that
fails, crashes or is not done by the round's deadline (+ a margin) leaves its boards without an
update, and the quorum decides as it does for boards."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterType,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.deployments import run_deployment
from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter
from prefect.states import Cancelling, Crashed

from tasks.board.inventory import Board
from tasks.fleet import fanout
from tasks.fleet.rounds import FleetRun

log = logging.getLogger(__name__)
MARGIN_S = 120.0  # past the round's deadline: a group run still going is given up
POLL_S = 1.0  # the group runs' states: one request a tick for all of them
HEARTBEAT_READ_S = 10.0  # the running group runs' heartbeats: one request this often


def fan_out_round(
    fleet: FleetRun, boards: list[Board], r: int, deadline_wall: float, groups: int,
    recipe: Path, overrides: dict[str, Any],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """Round ``r`` from the fleet's global weights as ``groups`` group runs (``recipe`` with
    ``overrides``: the fleet run's); the boards' results and one record per group run (its boards,
    flow run id, host, final state, bytes of updates sent back)."""
    params = {"recipe": str(recipe), "overrides": overrides, "run_id": fleet.run_id, "round": r,
              "deadline_wall": deadline_wall, "weights": fanout.pack_weights(fleet.weights, fleet.folder / f"round-{r:03d}")}  # fmt: skip
    sent = len(params["weights"])  # the bytes of weights each group run's parameters carry
    submit = _submitter(params, [f"group:{fleet.group}", "kind:fleet-group", f"round:{r}"])
    started = [(part, submit(part)) for part in fanout.split([b.name for b in boards], groups)]
    log.info("round %d: %d boards in %d group runs on the pool", r, len(boards), len(started))
    results, records = _collect(fleet, r, started, deadline_wall + MARGIN_S, submit)
    return results, [{**rec, "bytes_out": sent} for rec in records]


def _submitter(params: dict[str, Any], tags: list[str]) -> Callable[[list[str]], Any]:
    """A function that starts a group run of these boards (without waiting for it); its id."""

    def submit(part: list[str]) -> Any:
        run = run_deployment(fanout.GROUP_DEPLOYMENT, parameters={"params": {**params, "boards": part}},
                             timeout=0, tags=tags)  # fmt: skip
        return run.id

    return submit


def _collect(
    fleet: FleetRun, r: int, started: list[tuple[list[str], Any]], give_up: float,
    submit: Callable[[list[str]], Any],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """Wait for the group runs; a run whose host went silent (no heartbeat for :func:`stale_s`) is
    marked Crashed and its group started once more, on whichever host takes it (its boards' jobs
    go on: the new run asks for the same job ids)."""
    results: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    out = fleet.folder / f"round-{r:03d}"
    with get_client(sync_client=True) as client:
        pending = {str(i): (part, i, False) for part, i in started}
        checked = time.monotonic()  # the hosts' heartbeats are read every HEARTBEAT_READ_S, not each tick
        while pending:
            runs = {str(run.id): run for run in _read_runs(client, [i for _, i, _ in pending.values()])}
            late = time.time() > give_up
            silent: set[str] = set()
            if not late and time.monotonic() - checked >= HEARTBEAT_READ_S:
                checked = time.monotonic()
                silent = _lost(client, [run for k, run in runs.items() if not pending[k][2]])
            for key, (part, _, _) in list(pending.items()):
                run = runs.get(key)
                if run is None:
                    continue
                if key in silent:
                    why = f"its host went silent: no heartbeat for {stale_s():.0f} s"
                    client.set_flow_run_state(run.id, Crashed(message=why), force=True)
                    records.append({"boards": part, "flow_run_id": str(run.id), "state": "Crashed",
                                    "bytes_back": 0, "host": None, "lost": why})  # fmt: skip
                    del pending[key]
                    new = submit(part)
                    pending[str(new)] = (part, new, True)
                    log.warning(
                        "round %d: group run %s lost (%s); started again as %s", r, run.name, why, new
                    )
                    continue
                if not (run.state and run.state.is_final()) and not late:
                    continue
                del pending[key]
                records.append(_finished(client, run, part, out, results, late))
            if pending:
                time.sleep(POLL_S)
    return results, records


def _read_runs(client: Any, ids: list[Any]) -> list[Any]:
    """The flow runs ``ids``, read in one request (a round's group runs, every tick)."""
    flt = FlowRunFilter(id=FlowRunFilterId(any_=list(ids)))
    return client.read_flow_runs(flow_run_filter=flt, limit=len(ids))


def stale_s() -> float:
    """Seconds without a heartbeat after which a running group run's host counts as lost
    (``ODL_GROUP_STALE_S``; default three of the hosts' 30 s heartbeats and a margin)."""
    return float(os.environ.get("ODL_GROUP_STALE_S") or 100)


def _lost(client: Any, runs: list[Any]) -> set[str]:
    """The ids of those ``runs`` that are Running but whose last sign of life (a heartbeat, else their
    start) is older than :func:`stale_s`: their heartbeats read in one request."""
    running = [run for run in runs if run.state and run.state.is_running()]
    if not running:
        return set()
    last = {f"prefect.flow-run.{run.id}": run.state.timestamp.timestamp() for run in running}
    where = EventFilter(
        occurred=EventOccurredFilter(since=datetime.fromtimestamp(time.time() - stale_s(), UTC)),
        event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
        resource=EventResourceFilter(id=list(last)),
    )
    page = client.read_events(where, limit=50)  # the heartbeats within stale_s, a page a request
    while True:
        for e in page.events:
            rid = e.resource.id
            if rid in last:
                last[rid] = max(last[rid], e.occurred.timestamp())
        if not page.next_page:
            break
        page = client.read_events_page(page.next_page)
    return {rid.removeprefix("prefect.flow-run.") for rid, at in last.items() if time.time() - at > stale_s()}


def _finished(client: Any, run: Any, part: list[str], out: Path, results: dict[str, Any], late: bool) -> dict:
    """Take a group run's updates into ``results`` (or its boards' failure); its record."""
    state = run.state
    record = {"boards": part, "flow_run_id": str(run.id), "state": state.name if state else None,
              "bytes_back": 0, "host": None}  # fmt: skip
    if late and not state.is_final():
        client.set_flow_run_state(run.id, Cancelling(message="the fleet round's deadline passed"), force=True)
        results.update(fanout.group_failed(part, f"group run {run.name}: not done by the round's deadline"))
        return record
    if not state.is_completed():
        why = f"group run {run.name} ended {state.name}: {(state.message or '')[:200]}"
        results.update(fanout.group_failed(part, why))
        return record
    flt = ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]), type=ArtifactFilterType(any_=[fanout.RESULT_TYPE])
    )
    found = client.read_artifacts(artifact_filter=flt)
    if not found:
        results.update(fanout.group_failed(part, f"group run {run.name} sent back no updates"))
        return record
    items = found[0].data
    items = json.loads(items) if isinstance(items, str) else items  # the server keeps it as JSON text
    for item in items:
        results[item["board"]] = fanout.received(item, out / item["board"])
    record["bytes_back"] = fanout.payload_bytes(items)
    record["host"] = items[0].get("host") if items else None
    return record
