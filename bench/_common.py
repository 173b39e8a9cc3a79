"""Helpers shared by the benchmarks: result files, tables, a throw-away virtual board, subprocess JSON.

Benchmarks are scripts (``.venv/bin/python bench/X.py``); each puts the project root on
``sys.path`` before importing this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tasks.paths import PROJECT_ROOT
from tasks.vboard.venv import shared_board_venv

RESULTS_DIR = PROJECT_ROOT / "bench" / "results"
# The board venv (numpy + onnxruntime-training-cpu) shared with the tests, one per content of the
# board requirements (tasks.vboard.venv.shared_board_venv)
BOARD_VENV = shared_board_venv()


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn()`` took."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def write_results(name: str, figures: dict[str, Any], out: Path | None = None) -> Path:
    """Write ``figures`` (plus machine facts) to ``out`` (default ``bench/results/<name>.json``)."""
    path = Path(out) if out else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    facts = {"cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "when": time.time()}
    path.write_text(json.dumps({**figures, "machine": facts}, indent=2, default=str) + "\n")
    return path


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A fixed-width text table: ``columns`` are (key, header) pairs; floats get 3 significant digits (whole numbers from 1000)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"
        return str(v)

    cells = [[cell(r.get(k, "")) for k, _ in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (_, h) in enumerate(columns)]
    lines = ["  ".join(h.rjust(w) for (_, h), w in zip(columns, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


@contextlib.contextmanager
def odl_home(home: Path) -> Iterator[Path]:
    """Point ``ODL_HOME`` at ``home`` for the block (restored afterwards)."""
    old = os.environ.get("ODL_HOME")
    os.environ["ODL_HOME"] = str(home)
    try:
        yield home
    finally:
        if old is None:
            os.environ.pop("ODL_HOME", None)
        else:
            os.environ["ODL_HOME"] = old


@contextlib.contextmanager
def virtual_board(prefix: str) -> Iterator[Any]:
    """A throw-away virtual board (own sshd, user, netns) in the current ODL_HOME; purged at the end."""
    from tasks.vboard.lifecycle import board_down, board_up

    name = f"{prefix}{os.getpid() % 100000}"
    board = board_up(name, venv=BOARD_VENV)
    try:
        yield board
    finally:
        board_down(name, purge=True)


def json_run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Run ``argv`` and parse the last stdout line as JSON; SystemExit with stderr if it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=PROJECT_ROOT)
    lines = proc.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        raise SystemExit(f"{' '.join(argv[:3])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def child_json(argv: list[str], timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Run a benchmark's child process: (its last stdout line as JSON, "") or (None, why not: its
    exit code and last stderr line, or the timeout)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"crash: no result in {timeout:g} s"
    lines = proc.stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        return json.loads(lines[-1]), ""
    return None, f"crash (exit {proc.returncode}): {(proc.stderr.strip().splitlines() or ['no output'])[-1]}"


def board_env() -> dict[str, str]:
    """The environment of a local agent run: no ODL_AGENT_* test switches, the project on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ODL_AGENT_")}
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    return env


def install_job(root: Path, spec: Any, files: dict[str, Path]) -> Path:
    """Lay out an agent root like the board's (``blobs/<sha256>``, a fresh ``jobs/<id>/job.json``)."""
    import shutil

    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for sha, path in files.items():
        if not (root / "blobs" / sha).exists():
            shutil.copyfile(path, root / "blobs" / sha)
    jdir = root / "jobs" / spec.job_id
    shutil.rmtree(jdir, ignore_errors=True)
    jdir.mkdir(parents=True)
    (jdir / "job.json").write_text(spec.to_json())
    return jdir


def run_agent(python: Path, root: Path, jdir: Path) -> dict[str, Any]:
    """``device_agent run`` of the job in ``jdir`` with the board venv's ``python``; its result dict."""
    argv = [str(python), "-m", "device_agent", "--root", str(root), "run", str(jdir)]
    result = json_run(argv, env=board_env())
    if result.get("status") != "finished":
        raise SystemExit(f"agent run of {jdir.name} did not finish: {result}")
    return result


def tiled_npz(path: Path, rows: int, root: Path) -> Any:
    """The arrays of ``path`` repeated to ``rows`` samples, stored as blob ``root/blobs/<sha256>``
    (uncompressed, so the agent memory-maps it); returns its protocol DataRef. One epoch over it
    is the whole run, so a throughput figure is the steady-state step loop."""
    import numpy as np

    from device_agent.protocol import BlobRef, DataRef, file_sha256

    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    reps = -(-rows // len(next(iter(arrays.values()))))
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    tmp = root / "tiled.npz"
    np.savez(tmp, **{k: np.concatenate([v] * reps)[:rows] for k, v in arrays.items()})
    sha = file_sha256(tmp)
    os.replace(tmp, root / "blobs" / sha)
    return DataRef("npz", blob=BlobRef(sha, (root / "blobs" / sha).stat().st_size))


def physical_cores() -> int:
    """Physical CPU cores (ONNX Runtime's default intra-op thread count), from /proc/cpuinfo."""
    cores, phys = set(), "0"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            key, _, val = line.partition(":")
            if key.strip() == "physical id":
                phys = val.strip()
            elif key.strip() == "core id":
                cores.add((phys, val.strip()))
    return len(cores) or os.cpu_count() or 1


def interleaved_pairs(
    run_a: Callable[[], Any], run_b: Callable[[], Any], pairs: int
) -> list[tuple[Any, Any]]:
    """``pairs`` runs of each, in pairs whose order alternates (a b, b a, a b ...), so that a drift of
    the machine during the benchmark weighs on both sides alike."""
    out = []
    for i in range(pairs):
        if i % 2 == 0:
            a = run_a()
            b = run_b()
        else:
            b = run_b()
            a = run_a()
        out.append((a, b))
    return out


def spread(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    """The median of ``values`` with their range (what a ratio from several pairs is reported as)."""
    import statistics

    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
    }


def median_range(figure: dict[str, float]) -> str:
    """``spread``'s figure as text: ``1.93 (1.81-2.05, n=5)``."""
    return f"{figure['median']:g} ({figure['min']:g}-{figure['max']:g}, n={figure['n']})"
