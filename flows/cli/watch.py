"""``odl watch``: start a deployment run and follow it in a few lines (what ``make demo``,
``make nightly`` and ``make fleet`` print instead of Prefect's event stream).

One line per finished stage (its seconds), one live line of training progress (step, loss, ETA,
read from the board's events that the run logs), then the verdict (the state's message: the
gate's checks, failing first) and where the report is. A run refused at creation (an unknown
parameter) or a failed run prints its reason in one line and exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any

from tasks.prefect.params import run_name, run_tags, unknown_parameter
from tasks.stack import ownership, server

EVENT = re.compile(r"board \S+: (\w+) (.*)")
FIELD = re.compile(r"(\w+)=(\S+)")
REPORT_KEYS = ("odl-report-", "odl-fleet-")  # tasks.judge.report.report_key: a run's, a fleet's report


def cmd_watch(args: argparse.Namespace) -> int:
    """Create the run (named and tagged as the flow names it) and follow it to its end."""
    env = server.stack_env()
    if "PREFECT_API_URL" not in os.environ:  # this home's stack only (identity checked), never another's
        if not ownership.is_ours(env):
            print(
                ownership.foreign_server(env)
                or "odl watch: this home's Prefect stack is not up (odl stack up)"
            )
            return 2
        os.environ["PREFECT_API_URL"] = env["PREFECT_API_URL"]
    from prefect.deployments import run_deployment  # Prefect only for this command, after its URL is set

    params = json.loads(args.params)
    target = params.get("group") or params.get("board") or "vboard"
    recipe = params.get("recipe") or args.recipe
    unknown = _unknown_keys(args.deployment, params)
    if unknown:
        print(f"odl watch: run not created: {unknown}", file=sys.stderr)
        return 2
    try:
        run = run_deployment(
            args.deployment, parameters={"params": params}, timeout=0,
            flow_run_name=run_name(recipe, target),
            tags=run_tags(recipe, target, args.kind, fleet=args.kind == "fleet"),
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the server's refusal (422: a parameter), in one line
        print(f"odl watch: run not created: {_one_line(exc)}", file=sys.stderr)
        return 2
    ui = _ui()
    print(f"run {run.name}: {ui}/runs/flow-run/{run.id}")
    return follow(run.id, ui, args.timeout)


def follow(run_id: Any, ui: str, timeout: float) -> int:
    """Print finished stages and training progress until the run ends; its exit status."""
    from prefect.client.orchestration import get_client  # Prefect only for this command
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId  # Prefect only here

    stages = _Stages(_Progress(sys.stdout.isatty()))
    progress, deadline = stages.progress, time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(run_id)
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
            stages.poll(tasks, _logs(client, run_id), time.monotonic())
            state = run.state
            if state is not None and state.is_final():
                time.sleep(1.0)  # the run's last log lines reach the API in a batch
                stages.poll(tasks, _logs(client, run_id), float("inf"))
                progress.clear()
                print(_verdict(state))
                print(_where(client, run_id, ui))
                return 0 if state.is_completed() else 1
            if time.monotonic() > deadline:
                progress.clear()
                print(
                    f"still {state.name if state else 'pending'} after {timeout:.0f} s: {ui}/runs/flow-run/{run_id}"
                )
                return 1
            progress.show()
            time.sleep(1.0)


def _verdict(state: Any) -> str:
    """The final state's line(s): a completed run's message ("Promoted: v0003: ..."; its report line
    left to :func:`_where`), else the state's name and message."""
    if state.is_completed() and state.message:
        return "\n".join(line for line in state.message.splitlines() if not line.startswith("report: "))
    return f"{state.name}: {state.message or ''}".rstrip(": ")


def _logs(client: Any, run_id: Any, page: int = 200) -> list[Any]:
    """All the run's log lines in time order, page by page (the API gives at most 200 a call)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId  # Prefect only here
    from prefect.client.schemas.sorting import LogSort

    only = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))
    out: list[Any] = []
    while True:
        got = client.read_logs(log_filter=only, limit=page, offset=len(out), sort=LogSort.TIMESTAMP_ASC)
        out += got
        if len(got) < page:
            return out


LOG_LAG_S = 4.0  # the worker sends the run's log lines in batches (every 2 s by default)


class _Stages:
    """The finished stages' lines, in order, each once the run's logs have reached its end (or
    ``LOG_LAG_S`` after it was seen finished): the board's progress, logged while it trained but
    read later, comes before the stage's line, never after it."""

    def __init__(self, progress: _Progress) -> None:
        self.progress, self.done, self.fed = progress, set(), set()
        self.finished_at: dict[str, float] = {}
        self.latest: Any = None

    def poll(self, tasks: list[Any], logs: list[Any], now: float) -> None:
        """Feed the log lines not fed yet (``logs``: the run's, in time order), then print every
        finished stage that is due (in start order)."""
        for rec in logs:
            if rec.id not in self.fed:
                self.fed.add(rec.id)
                self.progress.feed(rec.message)
                self.latest = rec.timestamp if self.latest is None else max(self.latest, rec.timestamp)
        latest = self.latest
        for t in sorted(tasks, key=lambda t: t.start_time or t.expected_start_time or 0):
            if str(t.id) in self.done or not (t.state and t.state.is_final()):
                continue
            seen = self.finished_at.setdefault(str(t.id), now)
            caught_up = latest is not None and t.end_time is not None and latest >= t.end_time
            if not (caught_up or now - seen >= LOG_LAG_S):
                break  # this stage's log lines are not all in yet: it and the later ones wait
            self._print(t)

    def _print(self, t: Any) -> None:
        self.done.add(str(t.id))
        self.progress.clear()
        if t.name.startswith("train on "):
            self.progress.trained = True
            self.progress.finished()  # the training's last figures, then its stage
        secs = f"{t.total_run_time.total_seconds():.1f} s"
        mark = "ok  " if t.state.is_completed() else f"{t.state.name.upper():<4}"
        cached = " (cached)" if t.state.name == "Cached" else ""
        print(f"  {mark} {t.name} {secs}{cached}")


class _Progress:
    """The training line: "training: step 48/160 (30 %), epoch 3, loss 0.286, ETA 25 s"."""

    def __init__(self, live: bool) -> None:
        self.live, self.total, self.step, self.epoch, self.loss = live, 0, 0, 0, None
        self.started, self.printed, self.quarter, self.trained = 0.0, False, 0, False

    def feed(self, message: str) -> None:
        match = EVENT.match(message)
        if not match:
            return
        kind, fields = match.group(1), dict(FIELD.findall(match.group(2)))
        if kind == "started":
            self.total, self.started = int(fields.get("total_steps", 0)), time.monotonic()
        elif kind == "epoch":
            self.step, self.epoch = int(fields.get("step", 0)), int(fields.get("epoch", 0))
            self.loss = fields.get("train_loss")
        elif kind == "labels" and fields.get("done") == fields.get("total"):  # a teacher on the board
            self.clear()
            print(f"  teacher: labelled {fields.get('total')} unlabeled samples on the board")

    def line(self) -> str:
        pct = 100 * self.step / self.total if self.total else 0.0
        spent = time.monotonic() - self.started
        eta = f", ETA {spent / self.step * (self.total - self.step):.0f} s" if self.step else ""
        loss = f", loss {float(self.loss):.4g}" if self.loss else ""
        return f"  training: step {self.step}/{self.total} ({pct:.0f} %), epoch {self.epoch}{loss}{eta}"

    def show(self) -> None:
        if not self.total or not self.step or self.trained:  # after its stage's line: never again
            return
        if self.live:
            print("\r" + self.line().ljust(78), end="", flush=True)
            self.printed = True
        elif self.quarter < 4 * self.step // self.total < 4:  # not a terminal: at 25, 50, 75 %
            self.quarter = 4 * self.step // self.total
            print(self.line())

    def finished(self) -> None:
        """The training task ended: its last figures (once its log lines are in), unless a line
        at 100 % was shown."""
        if self.trained and self.total and self.step == self.total and not self.live and self.quarter < 4:
            self.quarter = 4
            print(self.line().replace(", ETA 0 s", ""))

    def clear(self) -> None:
        if self.printed:
            print("\r" + " " * 78 + "\r", end="", flush=True)
            self.printed = False


def _where(client: Any, run_id: Any, ui: str) -> str:
    """The last line: the run's report artifact's own page (a run's ``?tab=Artifacts`` falls back
    to its Logs tab until the page has loaded the run), else the run itself (a run without one)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId  # Prefect only here

    found = client.read_artifacts(
        artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
    )
    reports = [a for a in found if (a.key or "").startswith(REPORT_KEYS)]
    if reports:
        return f"report: {ui}/artifacts/artifact/{reports[-1].id}"
    return f"run: {ui}/runs/flow-run/{run_id}"


def _unknown_keys(deployment: str, params: dict[str, Any]) -> str | None:
    """The refusal of a key the deployment's parameter schema does not know, with a close match
    (the server would refuse it too, listing the keys without a suggestion); None when all are known."""
    from prefect.client.orchestration import get_client  # Prefect only for this command

    with get_client(sync_client=True) as client:
        schema = client.read_deployment_by_name(deployment).parameter_openapi_schema or {}
    allowed = _property_names(schema)
    for key in params:
        if allowed and key not in allowed:
            return unknown_parameter(key, allowed, f"{deployment} params")
    return None


def _property_names(schema: Any) -> list[str]:
    """The first ``propertyNames`` enum in a JSON schema (the flow parameters' known keys)."""
    if isinstance(schema, dict):
        if isinstance(schema.get("propertyNames"), dict) and "enum" in schema["propertyNames"]:
            return list(schema["propertyNames"]["enum"])
        children = schema.values()
    elif isinstance(schema, list):
        children = schema
    else:
        return []
    return next((found for child in children if (found := _property_names(child))), [])


def _ui() -> str:
    from prefect.settings import PREFECT_API_URL  # Prefect only for this command

    return str(PREFECT_API_URL.value() or "").removesuffix("/api")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    detail = re.search(r"'detail': '([^']*)'", text) or re.search(r'"detail":\s*"([^"]*)"', text)
    return detail.group(1) if detail else text[:400]
