"""Preparation's ONNX Runtime runs, supervised: each runs in a child process, and a child that dies
becomes one line naming the signal, the stage, the inputs and the first node whose run dies.

ONNX Runtime does not raise on everything: an integer division by zero kills the process with
SIGFPE, a bad kernel with SIGSEGV, the OOM killer with SIGKILL. Run in ``odl`` itself, such a graph
ends it with no message and a ``.partial`` folder left behind. So every graph preparation runs on
the user's model (tensor shapes, the batch check, validation's comparisons, the teacher) goes
through :func:`run_graph`, in a torch-free child (:mod:`tasks.prepare.sandbox.ort_child`) that lives as
long as the stage's :func:`supervised` block (one child per stage, not one per run; outside a
block one child serves the process). When the child dies, the graph runs again truncated after
its first k nodes, every tensor an output, in fresh children, bisecting for the first node whose
run dies (:mod:`tasks.prepare.sandbox.crash_site`). A child ended by a stop signal (SIGTERM...) stops ``odl``
like Ctrl-C (:class:`tasks.exits.Interrupted`).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tasks.errors import ModelError, PipelineError
from tasks.prepare.feeds import Feeds, representative
from tasks.prepare.sandbox.crash_site import where_it_dies
from tasks.prepare.sandbox.ort_parent import RUN_TIMEOUT_S, Child, Died, RunFailed, death
from tasks.recipe.schema import Recipe


@dataclass
class Stage:
    """A stage of preparation (export, artifacts, validation): its name, the error its failures
    raise, and the child its runs share (with the stages nested in it)."""

    name: str
    error: Callable[[str], PipelineError] = ModelError
    child: Child = field(default_factory=Child)


_STAGE: contextvars.ContextVar[Stage | None] = contextvars.ContextVar("odl_prepare_stage", default=None)
_PROCESS = Stage("preparation")  # the runs outside any supervised block
atexit.register(_PROCESS.child.stop)


@contextlib.contextmanager
def supervised(
    stage: str, recipe: Recipe | None = None, error: Callable[[str], PipelineError] = ModelError
) -> Iterator[Stage]:
    """The block's graph runs belong to ``stage``, take their inputs from ``recipe``'s data when
    given (:func:`tasks.prepare.feeds.representative`) and a death raises ``error(line)``; they
    share one child, the enclosing block's if there is one, else one stopped when the block ends."""
    outer = _STAGE.get()
    current = Stage(stage, error, outer.child if outer is not None else Child())
    token = _STAGE.set(current)
    try:
        with representative(recipe) if recipe is not None else contextlib.nullcontext():
            yield current
    finally:
        _STAGE.reset(token)
        if outer is None:
            current.child.stop()


def current_stage() -> Stage:
    """The innermost :func:`supervised` block's stage (the process's when there is none)."""
    return _STAGE.get() or _PROCESS


def run_graph(
    model: onnx.ModelProto | Path, feeds: Feeds, what: str, outputs: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Run ``model`` (a graph or an ONNX file) on ``feeds`` in the stage's child: its ``outputs``
    (default all) by name. RunFailed when ONNX Runtime raises; when the child dies, the stage's
    error with one line (:func:`crash_line`; ``what`` says what the run was for)."""
    return _run(model, feeds, what, outputs, shapes_only=False)


def run_shapes(model: onnx.ModelProto, feeds: Feeds, what: str) -> dict[str, tuple[list[int], np.dtype]]:
    """:func:`run_graph` of every output, giving each one's shape and dtype only (a shape probe's
    tensors stay in the child); an output ONNX Runtime gives back as None (a Range of constants
    it folded: ``torch.arange(x.shape[1])`` of a fixed length) keeps its inferred shape."""
    got = _run(model, feeds, what, None, shapes_only=True)
    return {name: (value[0], np.dtype(value[1])) for name, value in got.items() if value is not None}


def _run(model: onnx.ModelProto | Path, feeds: Feeds, what: str, outputs: list[str] | None, *,
         shapes_only: bool) -> dict[str, Any]:  # fmt: skip
    stage = current_stage()
    payload = str(model) if isinstance(model, Path) else model.SerializeToString()
    request = {"model": payload, "feeds": feeds.arrays, "outputs": outputs, "shapes_only": shapes_only}
    try:
        reply = stage.child.ask(request)
    except Died as died:
        graph = onnx.load(str(model)) if isinstance(model, Path) else model
        raise stage.error(crash_line(died.returncode, stage.name, what, feeds, graph)) from None
    except TimeoutError:
        raise stage.error(f"{what} on {feeds.origin} did not finish in {RUN_TIMEOUT_S} s "
                          f"in the {stage.name} stage") from None  # fmt: skip
    if not reply["ok"]:
        raise RunFailed(reply["phase"], reply["error"])
    return dict(zip(outputs or reply["outputs"], reply["values"], strict=True))


def graph_io(model: Path) -> tuple[list[tuple[str, list[Any], str]], list[str]]:
    """The inputs (name, shape, type) and output names ONNX Runtime sees in ``model``, loaded in
    the stage's child; RunFailed when it does not load."""
    stage = current_stage()
    try:
        reply = stage.child.ask({"model": str(model), "feeds": None, "outputs": None})
    except Died as died:
        raise stage.error(f"ONNX Runtime died of {death(died.returncode)} loading {model.name} "
                          f"in the {stage.name} stage") from None  # fmt: skip
    if not reply["ok"]:
        raise RunFailed(reply["phase"], reply["error"])
    return reply["inputs"], reply["outputs"]


def crash_line(returncode: int, stage: str, what: str, feeds: Feeds, model: onnx.ModelProto) -> str:
    """``ONNX Runtime died of SIGFPE (...) in the <stage> stage while <what> on <inputs>; <where>``."""
    return (
        f"ONNX Runtime died of {death(returncode)} in the {stage} stage while {what} on {feeds.origin}; "
        f"{where_it_dies(model, feeds, returncode)}"
    )
