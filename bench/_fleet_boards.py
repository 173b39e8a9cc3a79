"""Pull-mode boards for bench/fleet_scale.py: many real board agents on this machine, in waves.

Each board is a folder (its agent root) with its own key, its own data and its own pull service
(``python -m device_agent --root ROOT pull`` in the board environment: numpy and ONNX Runtime, no
torch), dialing the endpoint on loopback as a NAT'd board dials the host. A thousand services at
once would not fit this machine (~43 MB each), so :func:`run_waves` keeps ``wave`` of them running:
a board's service starts, takes the job waiting for it in the mailbox, trains, sends its update and
is stopped once its job is final; the next board's starts. Boards listed in ``vanish`` are killed
(SIGKILL, the whole process group: the service and its job) once they have taken their job, as a
board whose power or link is lost mid-round. A board's ``env`` is added to its service's (a
tampered agent: tests/fleet/tamper).

Run as its own process (``python bench/_fleet_boards.py PLAN.json``) so that the boards' CPU (the
services, the jobs, this launcher) is not counted as the host's.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def board_data(
    root: Path, index: int, pool_x: np.ndarray, pool_y: np.ndarray, samples: int, alpha: float
) -> int:
    """``ROOT/datasets/digits/own.npz``: ``samples`` of the pool drawn with a label skew of its own
    (Dirichlet ``alpha`` over the ten labels, seeded by the board's index); the count written."""
    rng = np.random.default_rng(1000 + index)
    weights = rng.dirichlet([alpha] * 10)[pool_y]
    idx = rng.choice(len(pool_y), size=samples, replace=True, p=weights / weights.sum())
    folder = root / "datasets" / "digits"
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "own.npz", x=pool_x[idx].astype(np.float32), y=pool_y[idx].astype(np.int64))
    return samples


def _done(db: sqlite3.Connection, boards: list[str]) -> dict[str, str]:
    """Each of ``boards`` that has a train job: the state of its latest."""
    if not boards:
        return {}
    marks = ",".join("?" * len(boards))
    rows = db.execute(
        f"SELECT board, state FROM jobs WHERE kind='train' AND board IN ({marks}) ORDER BY created", boards
    ).fetchall()
    return dict(rows)


def board_env(env: dict, extra: dict, agent: str) -> dict:
    """The service's environment: ``env`` and the board's ``extra`` (its PYTHONPATH after the agent's)."""
    if "PYTHONPATH" in extra:
        extra = {**extra, "PYTHONPATH": agent + os.pathsep + extra["PYTHONPATH"]}
    return {**env, **extra}


def run_waves(plan: dict) -> dict:
    """Start each board's service, ``plan['wave']`` at a time, and stop each once its job is final
    (or it vanished, or ``plan['life_s']`` passed); what happened to each board."""
    db = sqlite3.connect(plan["mailbox"], timeout=30)
    todo = list(plan["boards"])  # [{"name", "root"}]
    vanish = set(plan.get("vanish", ()))
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    outcome: dict[str, str] = {}
    env = {**os.environ, "PYTHONPATH": plan["agent"], "PYTHONUNBUFFERED": "1"}
    for k in [k for k in env if k.startswith(("PREFECT_", "ODL_"))]:
        env.pop(k)
    stop = False

    def _term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    peak = 0
    while (todo or running) and not stop:
        while todo and len(running) < plan["wave"]:
            b = todo.pop(0)
            log = open(Path(b["root"]) / "service.out", "ab")  # noqa: SIM115 - the child holds it
            proc = subprocess.Popen([plan["python"], "-m", "device_agent", "--root", b["root"], "pull"],
                                    env=board_env(env, b.get("env", {}), plan["agent"]),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # fmt: skip
            log.close()
            running[b["name"]] = (proc, time.monotonic())
        peak = max(peak, len(running))
        time.sleep(0.2)
        states = _done(db, list(running))
        for name, (proc, started) in list(running.items()):
            state = states.get(name)
            end = None
            if name in vanish and state in ("offered", "running"):
                end, sig = "vanished", signal.SIGKILL
            elif state in ("finished", "failed", "cancelled", "expired"):
                end, sig = state, signal.SIGTERM
            elif proc.poll() is not None:
                end, sig = f"service exited {proc.returncode}", signal.SIGTERM
            elif time.monotonic() - started > plan["life_s"]:
                end, sig = f"no final job in {plan['life_s']} s", signal.SIGKILL
            if end is None:
                continue
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            proc.wait()
            outcome[name] = end
            del running[name]
    for proc, _ in running.values():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return {"outcome": outcome, "peak_services": peak}


if __name__ == "__main__":
    plan = json.loads(Path(sys.argv[1]).read_text())
    result = run_waves(plan)
    Path(plan["out"]).write_text(json.dumps(result))
