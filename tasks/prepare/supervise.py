"""Preparation's ONNX Runtime runs, supervised: each runs in a child process, and a child that dies
becomes one line naming the signal, the stage, the inputs and the first node whose run dies.

ONNX Runtime does not raise on everything: an integer division by zero kills the process with
SIGFPE, a bad kernel with SIGSEGV, the OOM killer with SIGKILL. Run in ``odl`` itself, such a graph
ends it with no message and a ``.partial`` folder left behind. So every graph preparation runs on
the user's model (tensor shapes, the batch check, validation's comparisons, the teacher) goes
through :func:`run_graph`, in a torch-free child (:mod:`tasks.prepare.ort_child`) that lives as
long as the stage's :func:`supervised` block (one child per stage, not one per run; outside a
block one child serves the process). When the child dies, the graph runs again truncated after
its first k nodes, every tensor an output, in fresh children, bisecting for the first node whose
run dies, within ``BISECT_BUDGET_S``. A child ended by a stop signal (SIGTERM...) stops ``odl``
like Ctrl-C (:class:`tasks.exits.Interrupted`).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tasks.errors import ModelError, PipelineError
from tasks.exits import STOP_SIGNALS, Interrupted
from tasks.paths import PROJECT_ROOT
from tasks.prepare.feeds import Feeds, representative
from tasks.prepare.node_names import layer_of
from tasks.prepare.ort_child import HEADER, write_message
from tasks.recipe.schema import Recipe

RUN_TIMEOUT_S = 600
BISECT_BUDGET_S = 120
MEANING = {
    "SIGFPE": "an arithmetic fault: an integer division or remainder by zero",
    "SIGSEGV": "an invalid memory access",
    "SIGBUS": "a bus error",
    "SIGABRT": "an abort: a failed internal check",
    "SIGILL": "an illegal instruction: a CPU feature this machine lacks",
    "SIGKILL": "killed, most likely by the kernel's out-of-memory killer",
}


class RunFailed(Exception):
    """ONNX Runtime refused the graph (``phase`` "load") or raised running it ("run"); the child lives on."""

    def __init__(self, phase: str, error: str) -> None:
        self.phase, self.error = phase, error
        super().__init__(error)


class Died(Exception):
    """The child ended while it ran a request (``returncode``: -signal, or its exit status)."""

    def __init__(self, returncode: int, stderr: str = "") -> None:
        self.returncode, self.stderr = returncode, stderr
        super().__init__(death(returncode))


def death(returncode: int) -> str:
    """How a process ended: ``SIGFPE (an arithmetic fault: ...)`` for a signal, ``exit status N``."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
    return f"{name} ({MEANING[name]})" if name in MEANING else name


def stop_if_interrupted(returncode: int) -> None:
    """Raise :class:`Interrupted` when a child was ended by a stop signal (the user stops ``odl``)."""
    if -returncode in STOP_SIGNALS:
        raise Interrupted(-returncode)


class Child:
    """One ``ort_child`` process, started on the first request and again after it died; one request
    at a time (threads sharing the process's child take turns)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.errors: Any = None
        self.lock = threading.Lock()

    def ask(self, request: dict[str, Any], timeout: float = RUN_TIMEOUT_S) -> dict[str, Any]:
        """Send ``request`` and return the answer; :class:`Died` when the child ends first,
        TimeoutError (child killed) when it does not answer in ``timeout`` s."""
        with self.lock:
            return self._ask(request, timeout)

    def _ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            write_message(self.proc.stdin, request)
            return self._read(time.monotonic() + timeout)
        except (BrokenPipeError, EOFError):
            raise self._ended() from None
        except BaseException:  # a timeout or the user's Ctrl-C mid-request: the child is in an unknown state
            self.stop()
            raise

    def _start(self) -> None:
        self.errors = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "tasks.prepare.ort_child"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                                     cwd=PROJECT_ROOT)  # fmt: skip

    def _read(self, deadline: float) -> dict[str, Any]:
        head = self._exactly(HEADER, deadline)
        return pickle.loads(self._exactly(int.from_bytes(head, "big"), deadline))

    def _exactly(self, size: int, deadline: float) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        out, fd = bytearray(), self.proc.stdout.fileno()
        while len(out) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = self.proc.stdout.read1(size - len(out))  # type: ignore[attr-defined]
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def _ended(self) -> Died:
        assert self.proc is not None
        code = self.proc.wait()
        self.errors.seek(0)
        text = self.errors.read().decode(errors="replace")
        self.proc = None
        stop_if_interrupted(code)
        return Died(code, text)

    def stop(self) -> None:
        """End the child (closing its stdin ends it; killed if it does not end at once)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
    tensors stay in the child)."""
    got = _run(model, feeds, what, None, shapes_only=True)
    return {name: (shape, np.dtype(dtype)) for name, (shape, dtype) in got.items()}


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


def where_it_dies(model: onnx.ModelProto, feeds: Feeds, returncode: int) -> str:
    """The first node whose run dies, with its layer and what to do, or why none was found."""
    node, why = first_dying_node(model, feeds.arrays)
    return f"the first node whose run dies is {node_words(node, returncode)}" if node is not None else why


def node_words(node: onnx.NodeProto, returncode: int) -> str:
    """``'/loss/Div' (Div, layer loss): <what to change>`` for the node a run died in."""
    layer = layer_of(node.name)
    named = f"'{node.name}' ({node.op_type}" + (f", layer {layer})" if layer != node.name else ")")
    return f"{named}: {_advice(node, returncode)}"


def _advice(node: onnx.NodeProto, returncode: int) -> str:
    """What to change, from the signal and the operator."""
    if -returncode == signal.SIGFPE and node.op_type in ("Div", "Mod"):
        return ("its integer divisor is 0 for these inputs: keep what the model divides by at least 1 "
                "(e.g. clamp(min=1)) in its code")  # fmt: skip
    if -returncode == signal.SIGKILL:
        return "it needs more memory than this machine gives: lower training.batch_size or model.input_shape"
    return "the board's ONNX Runtime would die the same way on such inputs: change or replace that operation"


def prefix(model: onnx.ModelProto, count: int) -> onnx.ModelProto:
    """``model`` truncated after its first ``count`` nodes, each tensor they compute an output (so
    ONNX Runtime prunes none of them)."""
    part = onnx.ModelProto()
    part.CopyFrom(model)
    del part.graph.node[count:]
    del part.graph.output[:]
    part.graph.output.extend(
        onnx.helper.make_empty_tensor_value_info(o) for n in part.graph.node for o in n.output if o
    )
    return part


def first_dying_node(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], budget_s: float = BISECT_BUDGET_S
) -> tuple[onnx.NodeProto | None, str]:
    """Bisect the node prefixes of ``model`` in fresh children for the first node whose run dies:
    (that node, ""), or (None, why not) when the graph does not die run this way or time ran out."""
    count, deadline, child = len(model.graph.node), time.monotonic() + budget_s, Child()
    lo, hi = 0, count  # once the whole graph died: dies(hi) and not dies(lo)

    def dies(k: int) -> bool:
        try:
            child.ask({"model": prefix(model, k).SerializeToString(), "feeds": feeds, "outputs": None},
                      timeout=max(1.0, deadline - time.monotonic()))  # fmt: skip
        except Died:
            return True
        return False

    try:
        if not dies(count):
            return None, "the graph does not die when run alone node by node on these inputs"
        while hi - lo > 1:
            if time.monotonic() > deadline:
                return None, f"it dies within nodes {lo + 1}-{hi} (bisection stopped after {budget_s:.0f} s)"
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if dies(mid) else (mid, hi)
        return model.graph.node[hi - 1], ""
    except TimeoutError:
        return None, f"it dies within nodes {lo + 1}-{hi} (bisection stopped after {budget_s:.0f} s)"
    finally:
        child.stop()
