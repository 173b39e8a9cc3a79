"""The two step files of a PyTorch model from its TorchScript export, differentiated as ONNX.

The model and its loss are exported together by the TorchScript exporter (what the ORT path runs)
in the step's mode: every layer in training mode for the train step (BatchNorm as
``trainable.batchnorm`` says), eval mode for the eval step. The trainable tensors become inputs, a
training-mode BatchNorm becomes the operators that compute it, each dropout draws its mask from a
noise input (as the traced steps' random operators do: :mod:`.noise`), and :mod:`.onnx_grad` adds
the backward pass. Each file is run once in ONNX Runtime and compared with PyTorch's own autograd
on the same batch, the same masks, the same weights. A model with an operator or a construct this
path does not handle raises :class:`~.onnx_grad.Unsupported` before anything is written, and the
caller traces the step instead (:mod:`.steps`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from tasks.prepare.export.torchscript import quiet_output
from tasks.prepare.export.tracing import bags_as_embeddings, model_outputs, restored
from tasks.prepare.onnx_versions import OPSET, check_board_loadable
from tasks.prepare.prefix import RANDOM_OPS
from tasks.prepare.runtimes.autograd import (  # noqa: F401 - their rules
    onnx_grad_index,
    onnx_grad_more,
    onnx_grad_nn,
    onnx_grad_resize,
    onnx_grad_rnn,
    onnx_grad_rules,
)
from tasks.prepare.runtimes.autograd.discrete import Orders, eager_pinned, order_outputs
from tasks.prepare.runtimes.autograd.graph_decisions import Decisions, decision_inputs, pinned
from tasks.prepare.runtimes.autograd.graph_dropout import dropout_nodes
from tasks.prepare.runtimes.autograd.graph_lowering import (
    fold_ifs,
    lower_batchnorms,
    observed,
    pruned,
    run,
    session,
)
from tasks.prepare.runtimes.autograd.graph_noise import LOWERED, lower_random, replayed
from tasks.prepare.runtimes.autograd.noise import NoiseInput
from tasks.prepare.runtimes.autograd.onnx_grad import Unsupported, differentiate
from tasks.prepare.runtimes.autograd.onnx_step import FLOOR, RTOL, WIDE, noise_arrays, relative
from tasks.prepare.runtimes.autograd.trace import StepInputs, step_mode

log = logging.getLogger(__name__)


def graph_step(model: Any, step: StepInputs, outputs: list[str], grads: list[str], path: Path, *,
               training: bool, batchnorm: str, n_outputs: int = 1) -> tuple[list[NoiseInput], float]:  # fmt: skip
    """Write the train (``training``) or eval step of ``model`` to ``path``; its noise inputs and
    the largest relative difference from PyTorch's autograd. Unsupported when this path cannot."""
    names = list(step.trainable)
    with restored(model), _mode(model, step, training, batchnorm, n_outputs):
        graph = _exported(model, step, outputs)
        fold_ifs(graph, [t.numpy() for _, t in step.feeds], set(range(len(step.feeds))))
        _inputs_from(graph, names)
        lower_batchnorms(graph)
        arrays = [t.numpy() for _, t in step.feeds] + [t.numpy() for t in step.trainable.values()]
        shapes, types, values = observed(graph, arrays, set(range(len(step.feeds))))
        noise = lower_random(graph, shapes, types)
        arrays += noise_arrays(noise, len(arrays[0]), seed=1)
        decided = decision_inputs(graph) if training else []  # the forward's, before the backward's
        ordered = order_outputs(graph)
        if training:
            for grad, name in zip(
                differentiate(graph, names, "loss", shapes, types, values), grads, strict=True
            ):
                _rename(graph, grad, name)
                graph.graph.output.append(
                    helper.make_value_info(name, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
                )
        got, fetched = _run_fetching(graph, arrays, [n for _, n in decided] + ordered, path.name)
        decisions = Decisions([k for k, _ in decided], [fetched[n] for _, n in decided]) if decided else None
        orders = Orders([fetched[n] for n in ordered])
        masks = arrays[len(step.feeds) + len(names) :]
        want = _eager(model, step, masks, training, decisions, orders)
        if decisions is not None and decisions.pinned:
            log.info("%s: ONNX Runtime decided %d near-tie(s) of %d activation(s) otherwise than PyTorch (its choice "
                     "kept for the check)", path.name, decisions.pinned, len(decisions.at))  # fmt: skip
        if orders.pinned:
            log.info("%s: ONNX Runtime ordered near-ties of %d sort(s) otherwise than PyTorch (its order kept for the "
                     "check)", path.name, len(orders.pinned))  # fmt: skip
        diffs = {name: relative(g, w) for name, g, w in zip([*outputs, *grads], got, want, strict=True)}
        worst = max(diffs, key=diffs.__getitem__)
        if diffs[worst] > RTOL:
            _judged_in_float64(model, step, masks, training, [*outputs, *grads], got, want, path.name,
                               decisions=decisions, orders=orders)  # fmt: skip
    onnx.save(graph, str(path))
    return noise, diffs[worst]


def _run_fetching(graph: Any, arrays: list[np.ndarray], wanted: list[str],
                  what: str) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:  # fmt: skip
    """The step ``graph`` (pruned, checked loadable) run once in ONNX Runtime: its results, and the
    values of the tensors ``wanted`` (the inputs of the decided activations, :mod:`.graph_decisions`;
    the orders, :func:`.discrete.order_outputs`), fetched as extra outputs of that run, which the
    graph loses again."""
    seen, names = len(graph.graph.output), list(dict.fromkeys(wanted))
    given = dict(zip([i.name for i in graph.graph.input], arrays, strict=False))  # a feed's own
    known = {o.name for o in graph.graph.output} | set(given)
    extra = [n for n in names if n not in known]
    graph.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in extra)
    pruned(graph)
    check_board_loadable(graph, what)
    results = run(session(graph, what), arrays, what)
    del graph.graph.output[seen:]
    pruned(graph)
    fetched = given | dict(zip([o.name for o in graph.graph.output] + extra, results, strict=True))
    return results[:seen], fetched


def _judged_in_float64(model: Any, step: StepInputs, noise: list[np.ndarray], training: bool, names: list[str],
                       got: list[np.ndarray], want: list[np.ndarray], what: str, *,
                       decisions: Decisions | None = None, orders: Orders | None = None) -> None:  # fmt: skip
    """Unsupported unless each result beyond :data:`RTOL` of PyTorch's float32 is, measured against
    PyTorch's step in float64 (``decisions`` and ``orders``: ONNX Runtime's at near-ties,
    :mod:`.graph_decisions`, :func:`.discrete.eager_pinned`),
    within :data:`FLOOR` times PyTorch float32's own distance or within :data:`WIDE` (the traced
    steps' bound): float32 rounding a deep or grouped model amplifies, not a wrong gradient."""
    try:
        wide = copy.deepcopy(model).double()
        params = dict(wide.named_parameters())
        feeds = [(n, t.double() if t.is_floating_point() else t) for n, t in step.feeds]
        wide_step = StepInputs(feeds, step.model_inputs, {n: params[n].detach() for n in step.trainable}, {},
                               step.loss)  # fmt: skip
        exact = _eager(wide, wide_step, noise, training, decisions, orders)
    except Exception as exc:  # noqa: BLE001 - a model without float64 kernels: the float32 bound stands
        first = max(zip(names, got, want, strict=True), key=lambda r: relative(r[1], r[2]))
        raise Unsupported(f"{what} differs from PyTorch's autograd by {relative(first[1], first[2]):.3g} at "
                          f"{first[0]} (float64: {type(exc).__name__})") from exc  # fmt: skip
    for name, g, w, e in zip(names, got, want, exact, strict=True):
        diff, ours, own = relative(g, w), relative(g, e), relative(w, e)
        if diff > RTOL and ours > max(WIDE, FLOOR * own):
            raise Unsupported(f"{what} differs from PyTorch's autograd by {diff:.3g} at {name}, from its float64 "
                              f"step by {ours:.3g} (PyTorch float32's by {own:.3g})")  # fmt: skip


@contextlib.contextmanager
def _mode(model: Any, step: StepInputs, training: bool, batchnorm: str, outputs: int) -> Iterator[None]:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    inputs = tuple(t for _, t in step.feeds[: step.model_inputs])
    with step_mode(model, training, "frozen", inputs, outputs):
        for m in model.modules():
            if training and batchnorm != "frozen" and isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                if m.running_mean is None:
                    raise Unsupported("a BatchNorm without running statistics")
                m.training, m.momentum = True, 0.0
        yield


def _wrapped(model: Any, step: StepInputs) -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    n = step.model_inputs

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model
            self.training = True  # the exporter's training-mode export: nothing fused (Conv and BatchNorm)

        def forward(self, *args: Any) -> Any:
            loss, kept = step.loss(tuple(model_outputs(self.m(*args[:n]))), args[n:])
            return (loss, *kept)

    return Step()


def _exported(model: Any, step: StepInputs, outputs: list[str]) -> Any:
    import torch  # torch (heavy) only when a PyTorch model is built or run

    feeds = [name for name, _ in step.feeds]
    buffer = io.BytesIO()
    axes = {name: {0: "batch"} for name in feeds}
    first = step.feeds[0][1]
    with quiet_output("torch.onnx.export: the step"), dropout_nodes(model, first), bags_as_embeddings():
        try:
            torch.onnx.export(_wrapped(model, step), tuple(t for _, t in step.feeds), buffer, dynamo=False,
                              training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False,
                              opset_version=OPSET, input_names=feeds, output_names=outputs, dynamic_axes=axes)  # fmt: skip
        except Exception as exc:  # the exporter raises many types; the traced path may still do
            raise Unsupported(f"the TorchScript export of the step failed: {type(exc).__name__}") from exc
    graph = onnx.load_from_string(buffer.getvalue())
    if [i.name for i in graph.graph.input] != feeds or [o.name for o in graph.graph.output] != outputs:
        raise Unsupported("the exported step's inputs or outputs are not the step's")
    if any(n.op_type in RANDOM_OPS - LOWERED or n.domain not in ("", "ai.onnx") for n in graph.graph.node):
        raise Unsupported("a random operator drawn from no noise input (Multinomial), or a custom domain")
    return graph


def _inputs_from(graph: Any, names: list[str]) -> None:
    """The trainable tensors as graph inputs (after the feeds), named as the model names them."""
    renamed = {i.name: i.name.removeprefix("m.") for i in graph.graph.initializer}
    for node in graph.graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
    for i in graph.graph.initializer:
        i.name = renamed[i.name]
    inits = {i.name: i for i in graph.graph.initializer}
    missing = [n for n in names if n not in inits]
    if missing:
        raise Unsupported(f"the export holds no initializer {missing[0]}")
    for n in names:
        graph.graph.initializer.remove(inits[n])
        graph.graph.input.append(helper.make_tensor_value_info(n, inits[n].data_type, list(inits[n].dims)))


def _rename(graph: Any, old: str, new: str) -> None:
    for node in graph.graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        node.output[:] = [new if o == old else o for o in node.output]


def _eager(model: Any, step: StepInputs, noise: list[np.ndarray], training: bool,
           decisions: Decisions | None = None, orders: Orders | None = None) -> list[np.ndarray]:  # fmt: skip
    """PyTorch's loss, outputs and (``training``) gradients on the step's batch, each dropout
    and random draw taking its value from the step's noise inputs (:func:`.graph_noise.replayed`),
    each activation's near-ties decided as ONNX Runtime did (``decisions``: :func:`.graph_decisions.pinned`;
    computed again without when its calls do not pair up with the graph's nodes) and each sort's
    near-ties ordered as ONNX Runtime did (``orders``: :func:`.discrete.eager_pinned`). On one
    thread (:func:`one_thread`)."""
    with one_thread():
        result = _eager_once(model, step, noise, training, decisions, orders)
        if decisions is None or decisions.matched:
            return result
        return _eager_once(model, step, noise, training, None, orders)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch on one intra-op thread for the block, as the check's ONNX Runtime sessions: the check
    is one small batch, and a pool's threads spinning for a core another process holds stall it
    (the wiki's SSD-Lite at 96 px, its eager step with the host's other core busy: 4.8 s on two
    threads, 0.07 s on one; a preparation took 40.7 s where it takes 8)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _eager_once(model: Any, step: StepInputs, noise: list[np.ndarray], training: bool,
                decisions: Decisions | None, orders: Orders | None) -> list[np.ndarray]:  # fmt: skip
    import torch  # torch (heavy) only when a PyTorch model is built or run

    params = dict(model.named_parameters())
    chosen = [params[n] for n in step.trainable]
    flags = [p.requires_grad for p in chosen]
    try:
        with torch.enable_grad(), replayed(noise) as left, dropout_nodes(model, step.feeds[0][1]), \
                pinned(decisions, RTOL), eager_pinned(orders, RTOL):  # fmt: skip
            for p in chosen:
                p.requires_grad_(True)
            loss, *kept = _wrapped(model, step)(*(t for _, t in step.feeds))
            result = [loss, *kept]
            if training:
                result += [g if g is not None else torch.zeros_like(p)
                           for g, p in zip(torch.autograd.grad(loss, chosen, allow_unused=True), chosen, strict=True)]  # fmt: skip
            left()
    except Unsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's model may raise anything; the traced path reports it
        raise Unsupported(f"PyTorch's own step failed: {type(exc).__name__}") from exc
    finally:
        for p, flag in zip(chosen, flags, strict=True):
            p.requires_grad_(flag)
    return [r.detach().numpy() for r in result]
