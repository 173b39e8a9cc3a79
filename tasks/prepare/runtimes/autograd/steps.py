"""The autograd runtime's two step graphs of a recipe: ``train_step.onnx`` and ``eval_step.onnx``.

Train: feeds (the model's inputs, then the loss's labels, named as the ORT path's manifest names
them) + one input per trainable tensor + the noise inputs of its random draws -> ``loss``, the model
outputs as ORT's training graph returns them after the loss, then one gradient per trainable tensor.
Eval: the same inputs -> ``loss`` and the outputs, in eval mode. Frozen parameters and buffers are
initializers. Each decomposition the train step uses is checked against PyTorch (:mod:`.op_checks`)
and each file against its traced graph (:mod:`.onnx_step`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.errors import ArtifactError, ModelError, RecipeError
from tasks.prepare.export.tracing import model_outputs
from tasks.prepare.feeds import example_arrays
from tasks.prepare.runtimes.autograd.graph_eval import eval_step
from tasks.prepare.runtimes.autograd.graph_step import graph_step
from tasks.prepare.runtimes.autograd.losses import LossPlan, plan
from tasks.prepare.runtimes.autograd.noise import NoiseInput, replace_random
from tasks.prepare.runtimes.autograd.onnx_grad import Unsupported
from tasks.prepare.runtimes.autograd.onnx_step import StepGraph, export_step, writes_into
from tasks.prepare.runtimes.autograd.op_checks import check_recorded, recording
from tasks.prepare.runtimes.autograd.recurrent import differentiable
from tasks.prepare.runtimes.autograd.template import keep_outputs
from tasks.prepare.runtimes.autograd.trace import (
    StepInputs,
    decomposed,
    exported_forward,
    node_layer,
    same_forward,
    trace_step,
)
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
BATCHES = (7, 11, 13, 17, 19, 23, 29, 31, 37)  # the traces' example batch: a size no other axis has
TRAIN_FILE, EVAL_FILE = "train_step.onnx", "eval_step.onnx"


@dataclass(frozen=True)
class Steps:
    """What the two step files are: feeds (name, dtype, shape), noise inputs, outputs, gradients
    and the decomposition checks made."""

    feeds: list[dict[str, Any]]
    noise: list[NoiseInput]
    eval_noise: list[NoiseInput]
    outputs: list[str]
    gradients: list[str]
    loss: str
    checked: dict[str, float]
    eval_from_train: bool = False  # the eval step is the train step without its gradients


def example_batch(model: Any, input_shapes: list[tuple[int, ...]]) -> int:
    """A batch size equal to no size of the model's tensors or inputs: the tracer shares one symbol
    between equal sizes, and the batch must stay a symbol of its own."""
    sizes = {d for t in [*model.parameters(), *model.buffers()] for d in t.shape}
    sizes |= {d for shape in input_shapes for d in shape}
    return next(b for b in BATCHES if b not in sizes)


def model_inputs(recipe: Recipe, batch: int) -> tuple[Any, ...]:
    """``batch`` samples of the recipe's data for each model input (repeated when it has fewer)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    arrays = example_arrays(recipe, recipe.model.input_names, n=batch)
    return tuple(torch.from_numpy(np.ascontiguousarray(a[np.arange(batch) % len(a)])) for a in arrays)


def _eval_step(model: Any, step: StepInputs, outs: list[str], path: Path, inference: Any, model_out: tuple[Any, ...],
               kwargs: dict[str, Any]) -> float:  # fmt: skip
    """The eval step from the inference export and the loss (:mod:`.graph_eval`), else from its own
    export of the model in eval mode; its difference from PyTorch."""
    if inference is not None:
        try:
            return eval_step(inference, step, list(model_out), outs, path)
        except Unsupported as exc:
            log.debug("the eval step is exported apart (%s)", exc)
    return graph_step(model, step, outs, [], path, training=False, **kwargs)[1]


def build_steps(recipe: Recipe, model: Any, trainable: list[str], art: Path,
                held: dict[str, list[str]] | None = None, inference: Any = None) -> Steps:  # fmt: skip
    """Write ``art/train_step.onnx`` and ``art/eval_step.onnx`` for ``model``'s ``trainable`` tensors;
    ``held``: the names of the ``model`` tensors that hold each (by default its own name; an ONNX
    model's twin holds a shared initializer in several); ``inference``: the model's eval-mode export
    (an ONNX graph), which the eval step reuses where it can."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    twin, held = held is not None, {n: (held or {}).get(n, [n]) for n in trainable}

    batch = example_batch(model, [tuple(recipe.model.input_shape)])
    inputs = model_inputs(recipe, batch)
    with torch.no_grad():
        out = model.eval()(*inputs)
    outputs = tuple(model_outputs(out))  # a dict's values in order, as the exporters flatten it
    loss = plan(recipe, outputs, batch)
    feeds = [*zip(recipe.model.input_names, inputs, strict=True), *loss.labels]
    names = [*loss.kept]
    outs, grads = ["loss", *names], [f"{n}_grad" for n in trainable]
    if len(set(outs + grads + [n for n, _ in feeds] + trainable)) != len(outs) + len(grads) + len(
        feeds
    ) + len(trainable):
        raise RecipeError(
            "model.output_names", "names apart from the feeds, 'loss' and the trainable tensors", names
        )
    checked: dict[str, float] = {}
    described = [
        {"name": n, "dtype": str(t.numpy().dtype), "shape": ["batch", *t.shape[1:]]} for n, t in feeds
    ]
    if not twin:  # a PyTorch model: its TorchScript export differentiated as ONNX, where it can be
        params = dict(model.named_parameters())
        step = StepInputs(feeds, len(inputs), {n: params[n].detach() for n in trainable}, {}, loss.fn)
        try:
            kwargs = {"batchnorm": recipe.trainable.batchnorm, "n_outputs": len(recipe.model.output_names)}
            noise, diff = graph_step(model, step, outs, grads, art / TRAIN_FILE, training=True, **kwargs)
            eval_diff = _eval_step(model, step, outs, art / EVAL_FILE, inference, outputs, kwargs)
            checked = {"train step vs PyTorch autograd": diff, "eval step vs PyTorch": eval_diff}
            return Steps(described, noise, [], outs, grads, loss.name, checked)
        except Unsupported as exc:
            log.info("the steps are traced (%s)", exc)
    n_out = len(recipe.model.output_names)
    programs = {t: exported_forward(model, inputs, t, recipe.trainable.batchnorm, n_out, recipe.base_dir)
                for t in (True, False)}  # fmt: skip
    noise, derived = {}, False
    for training in (True, False):
        if not training and same_forward(programs[True], programs[False]):
            # the eval step is the train step without its gradients: one trace and export fewer
            pruned(art / TRAIN_FILE, outs, art / EVAL_FILE)
            noise[False], derived = noise[True], True
            log.debug(
                "the model computes the same in both modes: %s is %s without gradients", EVAL_FILE, TRAIN_FILE
            )
            continue
        path = art / (TRAIN_FILE if training else EVAL_FILE)
        step = functools.partial(_step, inputs=inputs, feeds=feeds, held=held, loss=loss, training=training,
                                 outputs=outs + (grads if training else []), checked=checked)  # fmt: skip
        noise[training] = _written(programs[training], step, path, checked)
    return Steps(described, noise[True], noise[False], outs, grads, loss.name, checked, derived)


def _written(
    program: Any, step: Callable[[Any], StepGraph], path: Path, checked: dict[str, float]
) -> list[NoiseInput]:
    """Trace ``step`` over the exported forward ``program`` and export it to ``path``; its noise inputs.

    The forward is traced by ``make_fx`` as it stands, decomposed as it is traced. The program's own
    decomposition pass (a whole re-trace) runs first only where that cannot do: a program that
    writes into a tensor (``bernoulli_``, ``div_``: torchvision's StochasticDepth), which the pass
    makes functional, or one whose direct trace fails or exports with its batch made a constant (a
    transformer encoder's fused path)."""
    if not writes_into(program):
        try:
            graph = step(differentiable(program.module()))
            fixed = fixed_batch(graph.gm)
            if fixed is not None:  # known before the export would find it
                raise ModelError(f"the direct trace fixes the batch at {fixed}")
            checked.update(export_step(graph, path))
            return graph.noise
        except (ModelError, ArtifactError) as exc:
            log.debug("%s: traced again after the forward's decomposition pass (%s)", path.name, exc)
    graph = step(decomposed(program))
    checked.update(export_step(graph, path))
    return graph.noise


def fixed_batch(gm: Any) -> int | None:
    """The batch a traced step's first input has as a constant (its trace specialised it: a
    transformer encoder's fused path read as it stands), else None."""
    size = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[0]
    expr = getattr(getattr(size, "node", None), "expr", size)
    return int(expr) if getattr(expr, "is_number", isinstance(expr, int)) else None


def _step(forward: Any, *, inputs: tuple[Any, ...], feeds: list[tuple[str, Any]], held: dict[str, list[str]],
          loss: LossPlan, training: bool, outputs: list[str], checked: dict[str, float]) -> StepGraph:  # fmt: skip
    """One step traced over ``forward`` (:func:`.trace.decomposed`), its decompositions checked and
    its random draws made inputs."""
    tensors = {**dict(forward.named_parameters()), **dict(forward.named_buffers())}
    chosen = {n: tensors[names[0]].detach() for n, names in held.items()}
    bound = {name for names in held.values() for name in names}
    frozen = {n: t.detach() for n, t in tensors.items() if n not in bound}
    step = StepInputs(feeds, len(inputs), chosen, frozen, loss.fn, held)
    with recording() as uses:
        gm = trace_step(forward, step, grads=training)
    checked.update(check_recorded(uses))
    batch_symbol = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[0].node.expr
    noise = replace_random(gm, batch_symbol, node_layer)
    front = [*feeds, *chosen.items()]
    return StepGraph(gm, front, {n for n, _ in feeds}, list(frozen.values()), noise, outputs)


def pruned(source: Path, outputs: list[str], target: Path) -> None:
    """Write ``target``: the step at ``source`` computing only ``outputs`` (its other outputs and
    what only they need removed; its inputs kept, named as before)."""
    import onnx  # the step files

    model = onnx.load(str(source))
    keep_outputs(model, outputs, inputs=False)
    onnx.save(model, str(target))
