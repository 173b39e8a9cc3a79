"""The train and eval steps of a PyTorch model as FX graphs of plain ATen operators, batch symbolic.

The forward is exported by ``torch.export`` in the step's mode (training: every layer in training
mode, BatchNorm as ``trainable.batchnorm`` says; eval: eval mode), decomposed to core ATen, then
``make_fx`` traces, over that graph, the function ``(feeds, trainable, frozen) -> (loss, outputs,
gradients)`` that ``torch.func.grad_and_value`` makes of it (the eval step: ``(loss, outputs)``).
The backward operators come out decomposed too (:mod:`.decompositions`), each use recorded for
:mod:`.op_checks`. The model is given back exactly as it was (:func:`tasks.prepare.export.tracing.restored`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tasks.errors import ModelError
from tasks.prepare.export.torchscript import quiet_stderr
from tasks.prepare.export.tracing import has_auxiliary_outputs, model_outputs, restored
from tasks.prepare.export.user_code import user_code_error
from tasks.prepare.messages import layer_of
from tasks.prepare.runtimes.autograd.decompositions import forward_table
from tasks.prepare.runtimes.autograd.noise import dropout_masks
from tasks.prepare.runtimes.autograd.op_checks import recorded_table
from tasks.prepare.runtimes.autograd.recurrent import differentiable, layer_ops

MAX_BATCH = 1 << 16
# (model outputs, labels) -> (loss, the outputs the step returns after the loss)
Loss = Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, tuple[Any, ...]]]


@dataclass(frozen=True)
class StepInputs:
    """What a step is traced on: its feeds (the model's inputs, then the loss's labels: name and an
    example tensor), the trainable and frozen tensors by name, the loss, and the names of the model
    tensors that hold each trainable one (its own name when absent)."""

    feeds: list[tuple[str, Any]]
    model_inputs: int
    trainable: dict[str, Any]
    frozen: dict[str, Any]
    loss: Loss
    held: dict[str, list[str]] | None = None

    def bound(self, trainable: dict[str, Any]) -> dict[str, Any]:
        """``trainable`` keyed by the model tensors that hold each (one value for several names:
        autograd sums their gradients)."""
        held = self.held or {}
        return {name: value for n, value in trainable.items() for name in held.get(n, [n])}


@contextlib.contextmanager
def step_mode(
    model: Any, training: bool, batchnorm: str, inputs: tuple[Any, ...], outputs: int
) -> Iterator[None]:
    """``model`` in the mode of a train (``training``) or eval step for the block, then as it was.

    Training: every module in training mode, except the root of a model that adds auxiliary
    outputs in training (Inception, GoogLeNet: the main output trains, as the ORT path does);
    BatchNorm ``frozen`` normalises with its running statistics, ``batch-stats`` with the batch's,
    its running statistics untouched (they are detached for the block).
    """
    import torch  # torch (heavy) only when a PyTorch model is built or run

    with restored(model):
        aux = training and has_auxiliary_outputs(model, inputs, outputs)
        for m in model.modules():
            m.training = training and not (aux and m is model)
            if training and isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                if batchnorm == "frozen":
                    m.training = False
                else:  # batch statistics, nothing updated
                    m.running_mean = m.running_var = m.num_batches_tracked = None
        yield


def forward_graph(model: Any, inputs: tuple[Any, ...], training: bool, batchnorm: str, outputs: int,
                  base_dir: Any) -> Any:  # fmt: skip
    """The model's forward in the step's mode as a core-ATen GraphModule with a symbolic batch."""
    return decomposed(exported_forward(model, inputs, training, batchnorm, outputs, base_dir))


def exported_forward(model: Any, inputs: tuple[Any, ...], training: bool, batchnorm: str, outputs: int,
                     base_dir: Any) -> Any:  # fmt: skip
    """``torch.export``'s program of the model's forward in the step's mode, batch symbolic (not yet
    decomposed: :func:`decomposed`)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    shapes = tuple({0: batch} for _ in inputs)
    with step_mode(model, training, batchnorm, inputs, outputs), layer_ops(model), dropout_masks(model):
        try:  # a failed export prints its partial FX graph on stderr: kept for the DEBUG log
            with quiet_stderr("torch.export of the model"):
                return torch.export.export(model, inputs, dynamic_shapes=shapes, strict=False)
        except Exception as exc:  # torch.export raises many types; all mean "cannot trace"
            named = user_code_error(exc, base_dir, "while torch.export traced it")
            mode = "training" if training else "eval"
            raise named or ModelError(
                f"torch.export cannot trace the model in {mode} mode: {_first_line(exc)}"
            ) from exc


def decomposed(program: Any) -> Any:
    """An exported forward decomposed to core ATen, its recurrent operators differentiable."""
    return differentiable(constants_held(program.run_decompositions(forward_table())))


def constants_held(program: Any) -> Any:
    """``program.module()`` with each tensor constant the export lifted (a tensor the forward makes:
    ``loss[mask] = -math.inf`` writes ``torch.tensor(-inf)``) held as a buffer, so a step takes it
    as a frozen tensor. Held as a plain attribute it stays a real tensor, which ``make_fx``'s fake
    tensors refuse as soon as an operator other than its ``lift_fresh_copy`` reads it (a
    decomposed forward's ``clone``)."""
    module = program.module()
    for name in program.graph_signature.lifted_tensor_constants:
        path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(path)
        value = getattr(owner, leaf)
        delattr(owner, leaf)
        owner.register_buffer(leaf, value, persistent=False)
    return module


def same_forward(a: Any, b: Any) -> bool:
    """Whether two exported forwards (of one model in two modes) compute the same thing: the same
    nodes, operators and arguments in the same order (a dropout of probability 0 in either mode is
    the identity in both)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    dropout = torch.ops.aten.dropout.default

    def signature(program: Any) -> list[Any]:
        nodes = list(program.graph.nodes)
        index = {n: i for i, n in enumerate(nodes)}
        key = lambda v: ("node", index[v]) if isinstance(v, torch.fx.Node) else repr(v)  # noqa: E731
        out = []
        for n in nodes:
            args = list(n.args)
            if n.target is dropout and len(args) > 2 and args[1] == 0:
                args[2] = None  # p = 0: the training flag changes nothing
            out.append((n.op, str(n.target), torch.fx.node.map_aggregate(args, key),
                        torch.fx.node.map_aggregate(dict(n.kwargs), key)))  # fmt: skip
        return out

    return signature(a) == signature(b)


def trace_step(forward: Any, step: StepInputs, *, grads: bool) -> Any:
    """``make_fx`` of the step over ``forward`` (from :func:`forward_graph`): placeholders are the
    feeds, the trainable then the frozen tensors; results the loss, the outputs and (``grads``) the
    trainable tensors' gradients in their order."""
    import torch  # torch (heavy) only when a PyTorch model is built or run
    from torch.fx.experimental.proxy_tensor import make_fx  # the tracer of the step

    names, frozen_names = list(step.trainable), list(step.frozen)
    n_feeds, n_model = len(step.feeds), step.model_inputs

    def loss_of(trainable: dict, frozen: dict, feeds: tuple) -> tuple[Any, tuple]:
        out = torch.func.functional_call(forward, {**frozen, **step.bound(trainable)}, feeds[:n_model])
        loss, kept = step.loss(tuple(model_outputs(out)), feeds[n_model:])
        return loss, kept

    def run(*args: Any) -> tuple[Any, ...]:
        feeds = args[:n_feeds]
        trainable = dict(zip(names, args[n_feeds : n_feeds + len(names)], strict=True))
        frozen = dict(zip(frozen_names, args[n_feeds + len(names) :], strict=True))
        if not grads:
            loss, kept = loss_of(trainable, frozen, feeds)
            return (loss, *kept)
        gradients, (loss, kept) = torch.func.grad_and_value(
            lambda t: loss_of(t, frozen, feeds), has_aux=True
        )(trainable)
        return (loss, *kept, *(gradients[n] for n in names))

    example = [t for _, t in step.feeds] + list(step.trainable.values()) + list(step.frozen.values())
    try:
        return make_fx(run, decomposition_table=recorded_table(), tracing_mode="symbolic")(*example)
    except ModelError:
        raise
    except Exception as exc:  # make_fx raises many types; all mean "cannot differentiate"
        raise ModelError(
            f"PyTorch cannot trace the {'train' if grads else 'eval'} step: {_first_line(exc)}"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def node_layer(node: Any) -> str:
    """The model layer an FX node comes from (its ``nn_module_stack``), for messages."""
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()), ("", None))[0] if stack else ""
    return layer_of(path) if path else "the model's own forward"
