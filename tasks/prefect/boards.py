"""The boards as the Prefect server knows them: events, automations and a fleet overview.

* **Events** (``odl.board.*``, ``odl.job.*``, ``odl.model.*``), each with the board as its resource
  (``odl.board.<name>``): a heartbeat or an unreachable board from every board check and every
  run's deployment, a job's start, progress per epoch, end or failure, a promotion, a rejection,
  a rollout and a rollback. The UI's event feed and automations read them.
* **Automations** installed by ``odl stack up`` (:mod:`tasks.stack.automations`): "a board silent for 10 minutes" (no heartbeat;
  ``ODL_BOARD_SILENT_S`` changes the window) and "a nightly run failed twice" (two failed runs
  tagged ``kind:nightly`` within two days). They notify the block ``odl stack notify`` set
  (:mod:`tasks.stack.alerts`); with none set they are not installed.
* **The fleet overview**: a table artifact ``odl-boards`` with one row per inventory board
  (reachable, model in service and its metric, last training and its last fleet round (an outlier
  flagged), last promotion, free disk and RAM, its last few events with their age and a link to
  the UI's event feed filtered to the board, in six columns of stacked lines),
  refreshed by every run and by ``odl board check --all`` from what they saw
  (``$ODL_HOME/boards-seen/<board>.json``), the registry and the server's events.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

from tasks.board.check_items import fmt_mb
from tasks.board.inventory import load_inventory
from tasks.board.pull.link import ago
from tasks.board.pull.mailbox import Mailbox
from tasks.errors import BoardError
from tasks.paths import state_dir
from tasks.stack.automations import SPAN_S, events_page

log = logging.getLogger(__name__)

OVERVIEW_KEY = "odl-boards"
RECENT = 3  # events per board in the overview
EVENT_PAGES = 4  # pages of the boards' events the overview reads at most
PAGE_EVENTS = 50  # events a page (the most the server answers: its INTERACTIVE_PAGE_SIZE)
NONE = "–"  # an empty cell: the UI renders cells as markdown, where "-" is a list's bullet
BREAK = "<br>"  # a line break inside a cell


def resource(board: str) -> dict[str, str]:
    """A board as an event resource."""
    return {"prefect.resource.id": resource_id(board), "prefect.resource.name": board}


def emit(event: str, board: str, payload: dict[str, Any] | None = None) -> None:
    """Emit ``event`` about ``board`` to the Prefect server in use; never fails the caller."""
    try:
        from prefect.events import emit_event  # Prefect only when a server is in use

        emit_event(event=event, resource=resource(board), payload=payload or {})
    except Exception as exc:  # noqa: BLE001 - an event is a report, not a step of the run
        log.debug("event %s for %s not emitted: %s", event, board, exc)


def seen(board: str, **facts: Any) -> dict[str, Any]:
    """Record what was just seen of ``board`` (merged into its last record) and return the record."""
    path = state_dir("boards-seen") / f"{board}.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    record.update(facts, updated_at=time.time())
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return record


def heartbeat(board: str, reachable: bool, detail: dict[str, Any] | None = None) -> None:
    """A board check or a deployment reached the board (or did not): event and record."""
    seen(board, reachable=reachable, checked_at=time.time(), **(detail or {}))
    emit("odl.board.heartbeat" if reachable else "odl.board.unreachable", board, detail)


def resource_id(board: str) -> str:
    """The event resource id of ``board``."""
    return f"odl.board.{board}"


def ui_url() -> str:
    """The Prefect UI of the server in use ("" when none is set: a temporary server has no UI)."""
    try:
        from prefect.settings import PREFECT_UI_URL  # Prefect only when a server is in use

        return str(PREFECT_UI_URL.value() or "").rstrip("/")
    except Exception as exc:  # noqa: BLE001 - a link is a report, not a step of the run
        log.debug("no Prefect UI address: %s", exc)
        return ""


def events_link(board: str, around: float | None = None) -> str:
    """The UI's event feed filtered to ``board`` (around a time, else the last week); "" without a UI."""
    ui = ui_url()
    return events_page(ui, resource_id(board), around) if ui else ""


def recent_events(boards: list[str], n: int = RECENT) -> dict[str, list[tuple[str, float]]]:
    """The last ``n`` events of each board in the last week, newest first, as (type, epoch seconds),
    from the server in use (one with a UI); {} without one or when it does not answer. The boards'
    events are read together, newest first, a page a request and :data:`EVENT_PAGES` pages at most
    (a thousand boards' overview costs a few requests, not one a board): a board whose last event is
    older than those pages shows none, and its event feed link."""
    if not ui_url() or not boards:
        return {}
    try:
        from prefect.client.orchestration import get_client  # Prefect only when a server is in use
        from prefect.events.filters import EventFilter, EventOccurredFilter, EventResourceFilter

        since = EventOccurredFilter(since=datetime.now(UTC) - timedelta(seconds=SPAN_S))
        ids = {resource_id(b): b for b in boards}
        found: dict[str, list[tuple[str, float]]] = {b: [] for b in boards}
        with get_client(sync_client=True) as client:
            where = EventFilter(occurred=since, resource=EventResourceFilter(id=list(ids)))
            page = client.read_events(where, limit=PAGE_EVENTS)
            for _ in range(EVENT_PAGES):
                for e in page.events:
                    got = found.get(ids.get(e.resource.id, ""))
                    if got is not None and len(got) < n:
                        got.append((e.event, e.occurred.timestamp()))
                if not page.next_page or all(len(v) >= n for v in found.values()):
                    break
                page = client.read_events_page(page.next_page)
        return {b: v for b, v in found.items() if v}
    except Exception as exc:  # noqa: BLE001 - the overview is a report, not a step of the run
        log.debug("board events not read: %s", exc)
        return {}


def events_cell(events: list[tuple[str, float]], at: float, sep: str = ", ") -> str:
    """Events (type, time) with their age at ``at``: "board.heartbeat 2 min ago, job.finished 1 h ago"."""
    return sep.join(f"{kind.removeprefix('odl.')} {_age(at - t)}" for kind, t in events) or NONE


def overview_rows(
    boards: list[str], registry: Any, events: dict[str, list[tuple[str, float]]] | None = None, ui: str = ""
) -> list[dict[str, Any]]:
    """One row per board, six short columns (facts stacked in a cell, one a line, so the table fits
    a 1280 px window): reachable and when it was checked, what it serves (recipe and version, the
    metric, when promoted), the last training, free disk and RAM, its last ``events`` (type, time)
    and, with a ``ui``, a link to its event feed; from the records and the registry."""
    rows, at = [], time.time()
    pull = pull_boards(boards)
    for board in boards:
        path = state_dir("boards-seen") / f"{board}.json"
        rec = json.loads(path.read_text()) if path.is_file() else {}
        serving, trained = _serving(registry, board)
        reachable = {True: "yes", False: "NO"}.get(rec.get("reachable"), "not checked")
        checked = [_when(rec["checked_at"])] if rec.get("checked_at") else []
        if board in pull:  # a board that dials out: its enrolment and last check-in, not a check
            reachable, checked = f"pull, {pull[board][0]}", [f"checked in {ago(pull[board][1])}"]
        feed = [f"[event feed]({events_page(ui, resource_id(board))})"] if ui else []
        recent = (events or {}).get(board, [])
        rows.append({
            "board": board,
            "reachable": BREAK.join([reachable, *checked]),
            "serving": BREAK.join(serving) or NONE,
            "trained": BREAK.join([_when(trained), *rec.get("fleet", [])]),  # its last fleet round
            "free": f"disk {_size(rec.get('disk'))}{BREAK}RAM {_size(rec.get('ram'))}",
            "events": BREAK.join([events_cell(recent, at, BREAK)] * bool(recent) + feed) or NONE,
        })  # fmt: skip
    return rows


def pull_boards(boards: list[str]) -> dict[str, tuple[str, float | None]]:
    """The pull-mode boards among ``boards`` (the inventory's ``transport = "pull"``): their state
    and seconds since their last check-in, from the mailbox."""
    try:
        inventory = load_inventory()
    except BoardError:
        return {}
    names = [b for b in boards if b in inventory and inventory[b].transport == "pull"]
    if not names:
        return {}
    mailbox, out = Mailbox(), {}
    for name in names:
        record = mailbox.board(name)
        seen_s = record.seen_s if record else None
        out[name] = (record.state if record else "not enrolled", seen_s)
    return out


def _serving(registry: Any, board: str) -> tuple[list[str], float | None]:
    """What ``board`` serves, a few lines per recipe ("digits v0003", "accuracy 0.953", "promoted
    21:40"), and when it last trained (its newest version's record), from the registry (either
    backend: the local folder or the shared store)."""
    lines, trained = [], 0.0
    for recipe in registry.recipes(board):
        current, versions = registry.current(recipe, board), registry.versions(recipe, board)
        if versions:
            trained = max(trained, float(versions[-1].info.get("recorded_at") or 0))
        if current is not None:
            metric = (current.info.get("decision") or {}).get("metric")
            value = current.metrics.get(metric) if metric else None
            lines.append(f"{recipe} {current.name}")
            lines += [f"{metric} {value:.3g}"] if isinstance(value, (int, float)) else []
            lines.append(f"promoted {_when(current.info.get('recorded_at'))}")
    return lines, trained or None


def publish_overview(boards: list[str], registry: Any) -> list[dict[str, Any]]:
    """Create the ``odl-boards`` table artifact (a new version of the key each time)."""
    rows = overview_rows(boards, registry, recent_events(boards), ui_url())
    try:
        from prefect.artifacts import create_table_artifact  # Prefect only when a server is in use

        with warnings.catch_warnings():  # `odl board check` publishes outside a run, on purpose
            warnings.simplefilter("ignore", FutureWarning)
            create_table_artifact(rows, key=OVERVIEW_KEY, description="ODL fleet overview: one row per board")
    except Exception as exc:  # noqa: BLE001 - the overview is a report, not a step of the run
        log.debug("fleet overview not published: %s", exc)
    return rows


def flush(timeout: float = 10.0) -> None:
    """Send the events and run logs still queued (a command about to exit, or a flow run in this
    process whose server is about to stop: at exit Prefect would wait for that server), quietly."""
    try:
        from prefect.events.worker import EventsWorker  # Prefect only when a server is in use
        from prefect.logging.handlers import APILogWorker  # the run logs' sender

        logging.getLogger("EventsWorker").setLevel(logging.ERROR)  # "still processing items": it is
        EventsWorker.drain_all(timeout=timeout)
        APILogWorker.drain_all(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - an event is a report, not a step
        log.debug("events not flushed: %s", exc)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{max(int(seconds), 0)} s ago"


def _when(t: float | None) -> str:
    """A time in a short cell: "21:40" today, "11-25 21:40" this year, "2025-11-25" before."""
    if not t:
        return NONE
    when, now = time.localtime(t), time.localtime()
    same_day = when[:3] == now[:3]
    return time.strftime(
        "%H:%M" if same_day else "%m-%d %H:%M" if when.tm_year == now.tm_year else "%Y-%m-%d", when
    )


def _size(text: Any) -> str:
    """The leading size of a record's figure ("55.4 GB" of "55.4 GB free of 252.0 GB"), NONE without one."""
    found = re.match(r"\s*(\d+(?:\.\d+)?\s*[KMGT]?B)\b", str(text or ""))
    return found.group(1) if found else NONE


def free_space(info: Any) -> dict[str, str]:
    """What a deployment's ``info`` answer says of the board's free disk and RAM, as records keep it."""
    return {"disk": fmt_mb(info.disk_free_mb), "ram": fmt_mb(info.mem_available_mb)}
