"""A traced step as an ONNX file the board's plain ``onnxruntime.InferenceSession`` runs.

The step's graph is wrapped in a module whose inputs are the feeds, the trainable tensors and the
noise inputs (in that order, named as step.json names them) and whose frozen tensors are buffers:
``torch.onnx.export(..., dynamo=True)`` writes those as initializers, with the batch axis of every
feed and noise input dynamic. The file is checked to load on the board's ONNX Runtime (IR and
opset) and run once here against the traced graph itself.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tasks.errors import ArtifactError, ort_message
from tasks.prepare.export.torchscript import quiet_output
from tasks.prepare.onnx_versions import check_board_loadable
from tasks.prepare.runtimes.autograd import exporter, onnx_passes
from tasks.prepare.runtimes.autograd.discrete import order_name, order_nodes, run_pinned, with_orders
from tasks.prepare.runtimes.autograd.noise import NoiseInput
from tasks.prepare.runtimes.autograd.op_checks import check_recorded, recorded_table, recording
from tasks.prepare.runtimes.autograd.recurrent_onnx import expand
from tasks.prepare.runtimes.autograd.trace import MAX_BATCH
from tasks.quiet import ORT_CAUGHT

log = logging.getLogger(__name__)
NO_CONVERSION = re.compile(r"No ONNX function found for <OpOverload\(op='([^']+)', overload='([^']+)'\)>")
# (an exporter's failure, the output it printed) -> the error to raise in its place
Explain = Callable[[BaseException, str], Exception]
RTOL = 1e-4  # of the largest |value| of each result: the graph and ORT fuse float32 ops differently
FLOOR = 2.0  # beyond RTOL: ORT's distance from float64 at most this many times PyTorch float32's own
WIDE = 1e-3  # or at most this from float64 (PyTorch's float32 may be luckily close): 10x RTOL, 1 % is wrong


@dataclass(frozen=True)
class StepGraph:
    """A traced step and how to call it: named inputs before the frozen tensors (``front``: feeds
    then trainable, with example tensors), the frozen tensors, the noise inputs and output names."""

    gm: Any
    front: list[tuple[str, Any]]
    batched: set[str]
    frozen: list[Any]
    noise: list[NoiseInput]
    outputs: list[str]


def _module(step: StepGraph, gm: Any) -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gm = gm
            for i, tensor in enumerate(step.frozen):
                self.register_buffer(f"frozen_{i}", tensor.detach().clone())

        def forward(self, *args: Any) -> Any:
            front, noise = args[: len(step.front)], args[len(step.front) :]
            frozen = [getattr(self, f"frozen_{i}") for i in range(len(step.frozen))]
            return tuple(self.gm(*front, *frozen, *noise))

    return Step()


def exporting(what: str, call: Callable[[], Any], explain: Explain | None = None) -> Any:
    """``call()``, an ONNX exporter's run, with its output captured (logged at DEBUG); when it fails,
    ``explain``'s error (given the failure and the captured output: the TorchScript exporter's
    failures are the ORT path's, :func:`tasks.prepare.messages.export_failure`) or ArtifactError, one
    line naming ``what``."""
    with quiet_output(f"torch.onnx.export: {what}") as out:
        try:
            return call()
        except Exception as exc:  # the exporter raises many types; all mean "cannot export"
            failure = exc
    if explain is not None:
        raise explain(failure, out.text) from failure
    missing = NO_CONVERSION.search(str(failure))
    if missing:
        raise ArtifactError(f"{what} cannot be exported to ONNX: the exporter has no conversion for {missing[1]}."
                            f"{missing[2]}, which this model needs (train fewer layers, or use training.runtime = "
                            "'ort-training')") from failure  # fmt: skip
    line = (str(failure).strip().splitlines() or [""])[0][:300]
    raise ArtifactError(f"{what} cannot be exported to ONNX: {type(failure).__name__}: {line}") from failure


def noise_arrays(noise: list[NoiseInput], batch: int, seed: int = 0) -> list[np.ndarray]:
    """Uniform noise for ``noise`` at ``batch`` (what the board draws, for the checks here)."""
    rng = np.random.default_rng(seed)
    return [rng.random([batch if d == "batch" else d for d in n.shape], dtype=np.float32) for n in noise]


def export_step(step: StepGraph, path: Path) -> dict[str, float]:
    """Write ``step`` to ``path`` as ONNX; ArtifactError (one line) when it cannot be exported,
    would not load on the board or computes something else than the traced graph. The checks of the
    decompositions the export used (:func:`export_table`), as :func:`.op_checks.check_recorded`."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    noise = [torch.from_numpy(a) for a in noise_arrays(step.noise, len(step.front[0][1]))]
    args = tuple(t for _, t in step.front) + tuple(noise)
    shapes = [{0: batch} if name in step.batched else None for name, _ in step.front]
    shapes += [{i: batch for i, d in enumerate(n.shape) if d == "batch"} or None for n in step.noise]
    names = [n for n, _ in step.front] + [n.name for n in step.noise]
    orders = order_nodes(step.gm)  # exported as extra outputs for the check, then taken out
    module = _module(step, with_orders(step.gm, orders) if orders else step.gm)
    extra = [order_name(n) for n in orders]

    def write() -> None:
        exported = torch.export.export(module, args, dynamic_shapes=(tuple(shapes),), strict=False)
        table = {**exporter.decomposition_table(), **export_table()}
        if rewrites_with(exported, table):  # ours, and the exporter's, whose own pass export skips
            exported = exported.run_decompositions(table)
        program = exporter.export(exported, args, input_names=names, optimize=False,
                                  output_names=[*step.outputs, *extra])  # fmt: skip
        onnx_passes.optimize(program.model)  # what optimize=True does, the costly pass last
        program.save(str(path))
        stepped = onnx.load(str(path))
        if expand(stepped):  # recurrent layers: their ONNX operators in the placeholders' place
            onnx.save(stepped, str(path))

    with recording() as uses:
        exporting(f"the step {path.name}", write)
    checked = check_recorded(uses)
    model = onnx.load(str(path))
    check_board_loadable(model, path.name)
    check_runs(step, model, [a.numpy() for a in args], path.name)
    if extra:
        kept = [o for o in model.graph.output if o.name not in set(extra)]
        del model.graph.output[:]
        model.graph.output.extend(kept)
        onnx.save(model, str(path))
    return checked


def export_table() -> dict[Any, Callable[..., Any]]:
    """Our decompositions of the operators that the export's functionalisation writes and the
    exporter decomposes only into primitives it cannot convert (writes through a strided view),
    each recording its uses for :mod:`.op_checks`."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    op = torch.ops.aten.as_strided_scatter.default
    return {op: recorded_table()[op]}


def _returns_tensors(schema: Any) -> bool:
    """Whether an operator returns tensors (``sym_size`` returns a size, which no pass rewrites)."""
    return any(str(r.type).startswith("Tensor") for r in schema.returns)


def writes_into(exported: Any) -> bool:
    """Whether ``exported`` holds a mutable operator (``copy_`` into a strided view, ``bernoulli_``),
    which a decomposition pass makes functional (as a ``*_scatter``, ``as_strided_scatter`` among
    them)."""
    return any(schema.is_mutable for _, schema in _operators(exported))


def rewrites_with(exported: Any, table: dict[Any, Callable[..., Any]]) -> bool:
    """Whether decomposing ``exported`` with ``table`` can change it (else that pass, a whole
    re-trace: 1.5-1.9 s of digits' 10.4-10.8 s of step building, is skipped): the graph holds one of
    its operators, a mutable one (:func:`writes_into`), or a composite one (``to.dtype``: the
    export's training IR keeps them, every decomposition pass rewrites them)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    implicit = torch._C._dispatch_has_kernel_for_dispatch_key
    for target, schema in _operators(exported):
        composite = implicit(target.name(), "CompositeImplicitAutograd") and _returns_tensors(schema)
        if target in table or schema.is_mutable or composite:
            return True
    return False


def _operators(exported: Any) -> Iterator[tuple[Any, Any]]:
    for node in exported.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is not None:
            yield node.target, schema


def check_runs(step: StepGraph, model: Any, arrays: list[np.ndarray], what: str) -> float:
    """Run ``model`` (the step, with its orders as extra outputs) in ONNX Runtime on ``arrays`` and
    compare each result with the traced graph's, run with ONNX Runtime's orders where they differ
    only by near-ties (:mod:`.discrete`); the largest relative difference (ArtifactError beyond
    :data:`RTOL`, unless ONNX Runtime's result is within :data:`FLOOR` times PyTorch float32's own
    distance from the traced graph run in float64, or within :data:`WIDE` of it: float32 rounding
    that a deep model amplifies, judged against float64 rather than PyTorch's float32, which a
    grouped convolution's sums can leave closer to float64 than ONNX Runtime's by chance)."""
    import onnxruntime  # the inference build's API, as the board's
    import torch  # torch (heavy) only when a PyTorch model is built or run

    options = onnxruntime.SessionOptions()
    options.log_severity_level = ORT_CAUGHT
    try:
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        names = [i.name for i in session.get_inputs()]
        results = session.run(None, dict(zip(names, arrays, strict=True)))
    except Exception as exc:  # ONNX Runtime raises its own types (Fail, RuntimeException, ...)
        raise ArtifactError(f"{what} does not run in ONNX Runtime: {ort_message(str(exc))[:300] or type(exc).__name__} "
                            "(train fewer layers, or use training.runtime = 'ort-training')") from exc  # fmt: skip
    got, k = results[: len(step.outputs)], len(step.outputs)
    theirs = dict(zip([o.name for o in session.get_outputs()][k:], results[k:], strict=True))
    n = len(step.front)
    front, noise = [torch.from_numpy(a) for a in arrays[:n]], [torch.from_numpy(a) for a in arrays[n:]]
    want, differed = run_pinned(step.gm, [*front, *step.frozen, *noise], theirs, RTOL)
    if differed:
        log.info("%s: ONNX Runtime ordered or decided near-ties otherwise than PyTorch at %s (its choice kept "
                 "for the check)", what, ", ".join(differed))  # fmt: skip
    want = [w.detach().numpy() for w in want]
    diffs = [relative(g, w) for g, w in zip(got, want, strict=True)]
    if all(d <= RTOL for d in diffs):
        log.debug("%s matches the traced step within %.3g", what, max(diffs, default=0.0))
        return max(diffs, default=0.0)
    exact = _in_float64(step.gm, [*front, *step.frozen, *noise], theirs)
    for name, g, w, e, diff in zip(step.outputs, got, want, exact or want, diffs, strict=True):
        ours, own = (relative(g, e), relative(w, e)) if exact else (diff, 0.0)
        if not (diff <= RTOL or ours <= max(WIDE if exact else RTOL, FLOOR * own)):
            why = (
                f", and from that step in float64 by {ours:.3g} (at most {WIDE}, or {FLOOR}x PyTorch float32's "
                f"{own:.3g})"
            )
            raise ArtifactError(f"{what}: output {name!r} computed by ONNX Runtime differs from PyTorch's traced "
                                f"step by {diff:.3g} (relative; at most {RTOL} expected){why if exact else ''}")  # fmt: skip
        if diff > RTOL:
            log.info("%s: output %r differs from PyTorch's float32 by %.3g, float32 rounding: from the step in "
                     "float64 ONNX Runtime's differs by %.3g, PyTorch's by %.3g", what, name, diff, ours, own)  # fmt: skip
    return max(diffs)


def _in_float64(gm: Any, args: list[Any], theirs: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """The traced step's results in float64 with ONNX Runtime's near-tie choices, or None when an
    operator of it has no float64 kernel (then the float32 bound stands alone)."""
    try:
        results, _ = run_pinned(gm, args, theirs, RTOL, wide=True)
    except (RuntimeError, TypeError, NotImplementedError) as exc:  # PyTorch's "not implemented for 'Double'"
        log.debug("the step in float64 does not run: %s", exc)
        return None
    return [r.detach().numpy() for r in results]


def relative(got: np.ndarray, want: np.ndarray) -> float:
    """The largest |got - want| relative to the largest |want| (at least 1)."""
    if not want.size:
        return 0.0
    scale = max(1.0, float(np.abs(want).max()))
    return float(np.abs(got.astype(np.float64) - want).max()) / scale
