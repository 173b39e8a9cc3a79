"""``odl run RECIPE --board NAME``: prepare -> deploy -> train on the board -> retrieve, no Prefect.

(``odl flow`` runs the whole Prefect flow in-process, evaluation and promotion included.)
Progress goes to stderr; re-running the same command reattaches to the job already on the board.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from device_agent.protocol import Event


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``odl run`` to the ``odl`` parser."""
    p = sub.add_parser("run", help="prepare, deploy, train on a board and retrieve (no Prefect)")
    p.add_argument("recipe", type=Path, help="recipe TOML file")
    p.add_argument("--board", required=True, help="board name in the inventory")
    p.add_argument("--out", type=Path, help="output folder (default $ODL_HOME/runs/JOB_ID)")
    p.add_argument("--job-id", help="job id (default: recipe name + hash of the job's inputs)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe field (TOML value)")
    p.add_argument("--no-validate", action="store_true", help="skip the host dry-run of the recipe")
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from tasks.pipeline import run_pipeline
    from tasks.recipe.load import parse_override

    overrides = dict(parse_override(text) for text in args.set or [])
    bar = ProgressLine()
    summary = run_pipeline(
        args.recipe,
        args.board,
        args.out,
        job_id=args.job_id,
        overrides=overrides,
        on_event=bar.event,
        progress=bar.upload,
        validate=not args.no_validate,
    )
    bar.close()
    r = summary.result
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(r.metrics.items()))
    print(
        f"job {summary.job_id} on {summary.board}: {r.status}, {r.steps} steps, {r.epochs_done} epochs "
        f"in {r.duration_s:.1f} s; {metrics}"
    )
    print(f"uploaded {summary.bytes_uploaded} bytes ({summary.blobs_skipped} blob(s) already on the board)")
    print(f"outputs in {summary.out_dir}")
    return 0


class ProgressLine:
    """A one-line progress display on stderr for uploads (bytes) and training (epochs/steps)."""

    def __init__(self) -> None:
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def upload(self, done: int, total: int) -> None:
        """Upload progress callback."""
        pct = 100.0 * done / total if total else 100.0
        self._show(f"upload {done / 1e6:8.1f}/{total / 1e6:.1f} MB {pct:5.1f}%", done >= total)

    def event(self, ev: Event) -> None:
        """Training event callback."""
        d = ev.data
        if ev.type == "step":
            loss = d.get("loss")
            loss_txt = f" loss {loss:.4f}" if isinstance(loss, int | float) else ""
            self._show(f"train epoch {d.get('epoch', '?')} step {d.get('step', '?')}{loss_txt}", False)
        else:
            fields = " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in sorted(d.items())
                if not isinstance(v, dict | list)
            )
            self._show(f"{ev.type} {fields}", ev.type not in ("eval", "checkpoint"))

    def close(self) -> None:
        """End the progress line."""
        if self.tty:
            sys.stderr.write("\n")

    def _show(self, text: str, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self.last < (0.2 if self.tty else 2.0):
            return
        self.last = now
        if self.tty:
            sys.stderr.write(f"\r\033[K{text}")
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
