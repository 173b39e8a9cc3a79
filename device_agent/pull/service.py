"""``pull``: the board's service in pull mode. It dials the host, never the other way round.

Each check-in posts ``poll`` with the board's ``info`` and the state of every job folder it holds,
does the work the host hands back (``train``: :meth:`~device_agent.pull.jobs.PullJobs.take`;
``stop``: the job's cancel; ``install-model``: the agent's own install, its answer posted to
``work/<id>``), follows its jobs (:mod:`device_agent.pull.jobs`: start, events, outputs, result),
then sleeps what the host said (clamped to :data:`~device_agent.pull.contract.SLEEP_BOUNDS_S`,
±10 % jitter). A board still pending (enrolled without a code) asks ``enrol`` again instead, until
an operator accepts it.

A check-in that fails (the endpoint unreachable after the client's retries, an answer it cannot
read) is logged once and tried again after a backoff that doubles up to a minute. A refused
credential, a 401 or 403 to ``poll`` or ``enrol`` (the board unknown, revoked, its signature bad),
or an endpoint certificate other than the pinned one is logged in one line and ends the service
with exit UNTRUSTED. Log lines (one per change of state) go to stderr and ``ROOT/pull/service.log``.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from device_agent.atomic import atomic_write
from device_agent.errors import AgentError
from device_agent.job.jobdir import JobDir
from device_agent.job.jobstate import job_status
from device_agent.models import install
from device_agent.protocol import ExitCode
from device_agent.pull.client import Answer, Client, backoff_s, untrusted
from device_agent.pull.config import STATES, PullConfig, load_config, save_config
from device_agent.pull.contract import LONG_POLL_S, SLEEP_BOUNDS_S
from device_agent.pull.identity import pull_dir
from device_agent.pull.jobs import PullJobs, item_id
from device_agent.pull.transfer import fetch_blobs
from device_agent.sysinfo import board_info

log = logging.getLogger("device_agent.pull")
SERVICE_LOG = "service.log"
LOG_BYTES = 1 << 20  # service.log is rotated at this size (one older file kept)
REFUSED = (401, 403)


def require_config(root: Path) -> PullConfig:
    """The stored configuration, else INVALID_ARGUMENT saying to enrol first."""
    config = load_config(root)
    if config is None:
        raise AgentError(ExitCode.INVALID_ARGUMENT, f"pull: no {pull_dir(root) / 'config.json'}: run "
                                                    "`enrol --endpoint URL --pin sha256:HEX --name NAME` first")  # fmt: skip
    return config


def enrol(client: Client, root: Path, code: str | None = None) -> Answer:
    """``POST enrol`` with the board's public key; the state it answers is stored in the configuration."""
    config = client.config
    body = {
        "name": config.name,
        "public_key": client.identity.public_pem(),
        "info": board_info(root).to_dict(),
    }
    if code:
        body["code"] = code
    answer = client.call("POST", "enrol", body)
    if answer.status in REFUSED:
        raise untrusted(
            f"the endpoint refused to enrol board {config.name}: {answer.error} (HTTP {answer.status})"
        )
    state = answer.data.get("state")
    if answer.status not in (200, 202) or state not in STATES:
        raise AgentError(ExitCode.ENVIRONMENT, f"enrol: the endpoint answered {answer.status}: {answer.data}")
    client.config = config.with_state(str(state))
    save_config(root, client.config)
    return answer


def board_jobs(root: Path) -> dict[str, str]:
    """The state of each job folder on the board (``status``'s state)."""
    jobs = root / "jobs"
    found = {}
    for path in sorted(jobs.iterdir()) if jobs.is_dir() else []:
        if path.is_dir() and not path.is_symlink() and (path / "job.json").is_file():
            found[path.name] = str(job_status(JobDir(path, root))["state"])
    return found


def clamp_sleep(value: object) -> float:
    """The host's ``sleep_s`` within the contract's bounds (its lower bound when missing)."""
    low, high = SLEEP_BOUNDS_S
    wait = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else low
    return min(max(wait, low), high)


INFO_EVERY_S = 300.0  # how often a check-in carries the board's info (RAM, disk, versions): ~0.6 KB


def check_in(client: Client, root: Path, jobs: PullJobs, wait_s: float = 0.0, info: bool = True) -> float:
    """One check-in and its work; the seconds to sleep before the next. ``wait_s``: how long the
    host may hold the check-in of an idle board (a long poll); ``info``: send the board's info."""
    if client.config.state != "accepted":
        answer = enrol(client, root)
        log.info("board %s: enrolment %s", client.config.name, client.config.state)
        if client.config.state != "accepted":
            return clamp_sleep(answer.data.get("sleep_s"))
    body: dict[str, Any] = {"jobs": board_jobs(root), "wait_s": wait_s}
    if info:  # the host keeps the last one it got
        body["info"] = board_info(root).to_dict()
    answer = client.call("POST", "poll", body)
    if answer.status in REFUSED:
        raise untrusted(
            f"the endpoint refused board {client.config.name}: {answer.error} (HTTP {answer.status})"
        )
    work = answer.data.get("work", [])
    if answer.status != 200 or not isinstance(work, list):
        raise AgentError(ExitCode.ENVIRONMENT, f"poll: the endpoint answered {answer.status}: {answer.error}")
    for item in work:
        do_work(client, root, jobs, item)
    jobs.follow_all()
    return clamp_sleep(answer.data.get("sleep_s"))


def do_work(client: Client, root: Path, jobs: PullJobs, item: object) -> None:
    """One work item; its error is logged (the host offers it again, or learns it from the job)."""
    kind = item.get("kind") if isinstance(item, dict) else None
    try:
        if not isinstance(item, dict):
            raise AgentError(ExitCode.INVALID_SPEC, f"work item: expected an object (got {item!r})")
        if kind == "train":
            jobs.take(item)
        elif kind == "stop":
            jobs.stop(item)
        elif kind == "install-model":
            install_model(client, root, item)
        elif kind == "list-dataset":
            answer_listing(client, root, item)
        else:
            log.warning("work item %s: kind %r is not one this agent knows: skipped", item.get("id"), kind)
    except AgentError as exc:
        if exc.code == ExitCode.UNTRUSTED:
            raise
        name = item.get("id") if isinstance(item, dict) else None
        jobs.note(f"work {name}", f"work item {name} ({kind}): {exc}", logging.WARNING)


def install_model(client: Client, root: Path, item: dict[str, Any]) -> None:
    """``install-model``: fetch its blobs, install; the answer (or ``{"error"}``) is kept, then posted."""
    work_id = item_id(item)
    kept = pull_dir(root) / "work" / f"{work_id}.json"
    if kept.is_file():  # done before: the same answer again, nothing installed twice
        answer = json.loads(kept.read_text())
    else:
        answer = _install(client, root, item)
        kept.parent.mkdir(mode=0o700, exist_ok=True)
        atomic_write(kept, json.dumps(answer, sort_keys=True))
        log.info(
            "install-model %s: %s",
            work_id,
            answer.get("error") or f"{item.get('recipe')} {item.get('version')} in service",
        )
    posted = client.call("POST", f"work/{work_id}", answer)
    if posted.status != 200:
        raise AgentError(
            ExitCode.ENVIRONMENT, f"work/{work_id}: the endpoint answered {posted.status}: {posted.error}"
        )


def answer_listing(client: Client, root: Path, item: dict[str, Any]) -> None:
    """``list-dataset``: the agent's ``dataset`` answer for a folder under the root (read only)."""
    work_id = item_id(item)
    path, fmt = item.get("path"), item.get("format", "npz-shards")
    if not isinstance(path, str) or not isinstance(fmt, str):
        answer: dict[str, Any] = {"error": "list-dataset: expected path and format strings"}
    else:  # the agent's own `dataset` command: numpy is loaded there, not in the service
        done = subprocess.run([sys.executable, "-m", "device_agent", "--root", str(root), "dataset", path,
                               "--format", fmt], capture_output=True, text=True, timeout=600)  # fmt: skip
        lines = done.stdout.strip().splitlines()
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else {
            "error": (done.stderr.strip().splitlines() or [f"dataset exited {done.returncode}"])[-1]}  # fmt: skip
    posted = client.call("POST", f"work/{work_id}", answer)
    if posted.status != 200:
        raise AgentError(
            ExitCode.ENVIRONMENT, f"work/{work_id}: the endpoint answered {posted.status}: {posted.error}"
        )


def _install(client: Client, root: Path, item: dict[str, Any]) -> dict[str, Any]:
    try:
        fetch_blobs(client, root, item.get("blobs", {}))
    except AgentError as exc:
        if exc.code in (ExitCode.ENVIRONMENT, ExitCode.UNTRUSTED):
            raise  # the link, not the item: offered again, fetched again
        return {"error": str(exc)}
    recipe, version, files = item.get("recipe"), item.get("version"), item.get("files")
    if not isinstance(files, dict) or not isinstance(recipe, str) or not isinstance(version, str):
        return {"error": "install-model: expected recipe and version strings and files {name: sha256}"}
    try:
        return install(root, recipe, version, files)
    except AgentError as exc:
        return {"error": str(exc)}


def log_to_file(root: Path) -> logging.Handler:
    """Add ``ROOT/pull/service.log`` (rotated) to the service's log; the handler, to remove it after."""
    handler = logging.handlers.RotatingFileHandler(
        pull_dir(root) / SERVICE_LOG, maxBytes=LOG_BYTES, backupCount=1
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


def serve(root: Path, stop_after: int | None = None, *, client: Client | None = None,
          sleep: Callable[[float], None] = time.sleep) -> int:  # fmt: skip
    """Check in until stopped (``stop_after``: that many check-ins, whose errors are then raised)."""
    client = client or Client(root, require_config(root))
    handler = log_to_file(root)
    jobs, failures, done, last_error = PullJobs(client, root), 0, 0, ""
    info_due = 0.0  # the first check-in carries the board's info, then one every INFO_EVERY_S
    log.info("board %s: pull service started (endpoint %s)", client.config.name, client.config.url)
    try:
        while stop_after is None or done < stop_after:
            try:
                now = time.monotonic()
                wait = check_in(
                    client, root, jobs, LONG_POLL_S if stop_after is None else 0.0, now >= info_due
                )
                info_due = info_due if now < info_due else now + INFO_EVERY_S
                if last_error:
                    log.info("endpoint %s: check-ins work again", client.config.url)
                failures, last_error = 0, ""
            except AgentError as exc:
                if exc.code == ExitCode.UNTRUSTED:
                    log.error("%s: the service stops (exit %d)", exc, ExitCode.UNTRUSTED)
                    return int(ExitCode.UNTRUSTED)
                if stop_after is not None:
                    raise
                if str(exc) != last_error:
                    log.warning("check-in failed: %s", exc)
                failures, last_error, wait = failures + 1, str(exc), backoff_s(failures)
            done += 1
            if stop_after is None or done < stop_after:
                sleep(wait * random.uniform(0.9, 1.1))
        return int(ExitCode.OK)
    finally:
        client.close()
        log.removeHandler(handler)
        handler.close()
