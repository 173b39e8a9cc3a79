"""A board's part of a federated round, and the checks a fleet passes before any board is asked.

A board's part lists its dataset folder, deploys (the round's checkpoint is the only new blob after
the first round; with local differential privacy the job spec says how to noise the update), trains
there on its own data, and sends back ``trainable.npz`` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks import stages
from tasks.board.inventory import Board
from tasks.board.joblink import job_link
from tasks.errors import RecipeError, Straggler
from tasks.fleet.privacy import check_budget, local_privacy
from tasks.fleet.strategies import check_group
from tasks.hashing import file_sha256
from tasks.prepare import Prepared
from tasks.stages import nightly


@dataclass(frozen=True)
class BoardUpdate:
    """One board's part of a round: what it trained on and the tensors it sent back."""

    board: str
    job_id: str
    samples: int
    update: Path  # trainable.npz on the host
    metrics: dict[str, float]  # the job's final metrics (train_loss, eval_loss, eval_accuracy ...)
    bytes_down: int  # blobs uploaded to the board for this round
    bytes_up: int  # trainable.npz
    seconds: float  # the whole part: list, deploy, train, fetch
    train_s: float  # the job's own time on the board (result.json duration_s)
    files: int  # dataset files trained on


def check_fleet(recipe: Any, boards: list[Board]) -> None:
    """A fleet needs board-side data, a reachable quorum, a group (in buffered mode: a buffer no
    larger than the group) its strategy can combine (Krum, Bulyan: enough boards for
    ``fleet.byzantine``) and, when private, a budget for one round at least: RecipeError naming
    the field."""
    if recipe.data.board_dataset is None:
        raise RecipeError(
            "data.board_dataset", "the folder on each board holding its own data (a fleet trains there)"
        )
    if recipe.fleet.min_boards > len(boards):
        raise RecipeError(
            "fleet.min_boards", f"at most the group's {len(boards)} boards", recipe.fleet.min_boards
        )
    if recipe.fleet.mode == "buffered" and recipe.fleet.buffer_size > len(boards):
        raise RecipeError(
            "fleet.buffer_size", f"at most the group's {len(boards)} boards", recipe.fleet.buffer_size
        )
    if recipe.fleet.mode == "buffered":  # a robust strategy combines one buffer, not the group
        k = recipe.fleet.buffer_size
        check_group(recipe.fleet, k, f"a buffer of {k} arrivals (fleet.buffer_size)")
    else:
        check_group(recipe.fleet, len(boards))
    if recipe.fleet.privacy is not None:
        check_budget(recipe.fleet.privacy)


def board_round(
    board: Board,
    inp: stages.Inputs,
    prep: Prepared,
    checkpoint: Path,
    run_id: str,
    deadline: float,
    out_dir: Path,
    on_event: Callable[[Any], None] | None = None,
) -> BoardUpdate:
    """Train one round on ``board`` from ``checkpoint`` on the board's own data; fetch only its
    trained tensors. Past ``deadline`` (monotonic) it raises Straggler and cancels the job there."""
    t0 = time.monotonic()
    data = nightly.board_data(inp.recipe, board)
    assert data is not None  # check_fleet: the recipe names a board dataset
    extra = file_sha256(checkpoint) + "".join(f["sha256"] for f in data.record["files"])
    spec, files = stages.job_spec(
        inp, prep, stages.job_id(inp, run_id, extra), checkpoint=checkpoint, train_data=data.ref
    )
    # local differential privacy: the board clips and noises its update before it leaves
    spec = dataclasses.replace(spec, privacy=local_privacy(inp.recipe.fleet.privacy))
    deployed = stages.deploy(board, spec, files, outputs=("trainable",))
    try:
        training = stages.train(board, spec, files, on_event=on_event, end_orphans=True, deadline=deadline)
    except Straggler:
        _cancel(board, spec.job_id)
        raise
    got = stages.retrieve(board, training, out_dir, only=("trainable",))
    update = got.files["trainable"]
    return BoardUpdate(
        board=board.name,
        job_id=spec.job_id,
        samples=int(data.record["samples"]),
        update=update,
        metrics=dict(training.result.metrics),
        bytes_down=deployed.bytes_sent,
        bytes_up=update.stat().st_size,
        seconds=round(time.monotonic() - t0, 3),
        train_s=float(training.result.duration_s),
        files=len(data.record["files"]),
    )


def _cancel(board: Board, job_id: str) -> None:
    """Ask the board to stop a straggler's job (best effort: the board may be unreachable; the
    next round's job ends it anyway, as an orphan)."""
    with contextlib.suppress(Exception), job_link(board) as link:
        link.cancel(job_id)
