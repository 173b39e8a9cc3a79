"""The recipe's loss as PyTorch computes it in the autograd runtime's step, equal to the ORT path's.

The built-in losses reduce as ONNX Runtime's loss blocks do (``mean`` over every element; the
label feed named ``labels`` for cross-entropy, ``target`` for the others; ``bce-with-logits`` with
ORT's own formula, ``-(t log s(x) + (1 - t) log(1 - s(x)))``); ``distillation`` is the formula of
:mod:`tasks.prepare.losses.distillation`; ``embedded`` is the model's first output. A ``custom`` onnxblock
loss is ONNX, not PyTorch: it trains here only through its PyTorch twin (``loss.torch``), a callable
taking the model's outputs and then its label feeds, each by its graph name. A segmentation or
keypoints recipe's loss is its task's (:mod:`.task_losses`), labels fed as ``labels``. Each plan also says
what the step returns after the loss: the model's outputs, as ORT's training graph returns them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.errors import RecipeError
from tasks.prepare.export.torch_model import load_ref
from tasks.prepare.feeds import recipe_sample
from tasks.prepare.runtimes.autograd.task_losses import task_loss
from tasks.recipe.schema import Recipe

LABELS, TARGET = "labels", "target"


@dataclass(frozen=True)
class LossPlan:
    """The step's loss: ``fn(outputs, labels) -> (loss, outputs kept)``, its label feeds (name and
    example tensor), the names of the outputs kept and the manifest's name of the loss."""

    fn: Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, tuple[Any, ...]]]
    labels: list[tuple[str, Any]]
    kept: list[str]
    name: str


def builtin(kind: str, out: Any, label: Any) -> Any:
    """One of the four built-in losses, reduced as ORT's blocks reduce them."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    if kind == "cross-entropy":
        return torch.nn.functional.cross_entropy(out, label)
    if kind == "mse":
        return ((out - label) ** 2).mean()
    if kind == "l1":
        return (out - label).abs().mean()
    s = torch.sigmoid(out)  # bce-with-logits, ORT's formula
    return (-(torch.log(s) * label + torch.log(1 - s) * (1 - label))).mean()


def distillation(logits: Any, target: Any, temperature: float) -> Any:
    """:mod:`tasks.prepare.losses.distillation`'s loss: ``T^2 * mean_n(-sum_c t log_softmax(z / T))``."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    logp = torch.log_softmax(logits / temperature, dim=-1)
    return (logp * target).sum(dim=1).mean() * -(temperature**2)


def plan(recipe: Recipe, outputs: tuple[Any, ...], batch: int) -> LossPlan:
    """The loss plan of ``recipe`` for a model returning ``outputs`` (example tensors at ``batch``)."""
    kind, names = recipe.loss.kind, list(recipe.model.output_names)
    if kind == "embedded":
        if outputs[0].dim() != 0:
            raise RecipeError("loss.kind", "'embedded' only for a model whose first output is a scalar loss",
                              f"first output '{names[0]}' has shape {shape_of(outputs[0])}")  # fmt: skip
        return LossPlan(lambda outs, labels: (outs[0], tuple(outs[1:])), [], names[1:], "embedded")
    if kind == "custom":
        return _twin(recipe, outputs, names, batch)
    if len(outputs) != 1:
        raise RecipeError("loss.kind", f"a custom or embedded loss for a model with {len(outputs)} outputs "
                          f"({names}); '{kind}' takes exactly one", kind)  # fmt: skip
    out = outputs[0]
    if recipe.task in ("segmentation", "keypoints"):
        fn, name, fallback = task_loss(recipe, out, names[0])
        label = _example(recipe, LABELS, 1, batch, fallback, fallback.dtype)
        return LossPlan(lambda o, lab: (fn(o[0], lab[0]), o), [(LABELS, label)], names, name)
    if kind == "distillation":
        if out.dim() != 2:
            raise RecipeError("loss.kind", "'distillation' for a model with one [batch, classes] output",
                              f"outputs {', '.join(shape_of(o) for o in outputs)}")  # fmt: skip
        t = recipe.teacher.temperature if recipe.teacher else 1.0
        soft = _example(recipe, LABELS, 1, batch, out.detach().softmax(-1).numpy(), np.float32)
        return LossPlan(lambda o, lab: (distillation(o[0], lab[0], t), o), [(LABELS, soft)], names,
                        f"distillation (T = {t:g})")  # fmt: skip
    if kind == "cross-entropy" and out.dim() > 2:  # the ORT path's words (ort_training.generate.build_loss)
        raise RecipeError("loss.kind", f"a loss matching output '{names[0]}' of {out.dim()} dims (per-pixel class "
                          f"scores [batch, classes, H, W] are task = \"segmentation\"; cross-entropy of task "
                          f"'{recipe.task}' needs [batch, num_classes={recipe.model.num_classes}])", kind)  # fmt: skip
    if kind == "cross-entropy" and (
        out.dim() != 2 or out.shape[1] != (recipe.model.num_classes or out.shape[1])
    ):
        raise RecipeError("loss.kind", f"a loss matching output '{names[0]}' of shape {shape_of(out)} (cross-entropy "
                          f"needs [batch, num_classes={recipe.model.num_classes}])", kind)  # fmt: skip
    if kind == "cross-entropy":
        label = _example(recipe, LABELS, 1, batch, np.zeros(batch, np.int64), np.int64)
        return LossPlan(lambda o, lab: (builtin(kind, o[0], lab[0]), o), [(LABELS, label)], names, kind)
    fallback = np.random.default_rng(0).random(tuple(out.shape), dtype=np.float32)
    target = _example(recipe, TARGET, 1, batch, fallback, np.float32)
    return LossPlan(lambda o, lab: (builtin(kind, o[0], lab[0]), o), [(TARGET, target)], names, kind)


def shape_of(tensor: Any) -> str:
    """An example tensor's shape for a message, its batch axis named ``batch`` as the ORT path's
    messages name it (not the trace's example batch, :data:`.steps.BATCHES`): ``[batch, 4, 32]``."""
    return "[" + ", ".join(["batch", *map(str, tensor.shape[1:])] if tensor.dim() else []) + "]"


def _twin(recipe: Recipe, outputs: tuple[Any, ...], names: list[str], batch: int) -> LossPlan:
    """A custom loss through its PyTorch twin ``loss.torch``: its parameters after the model's
    outputs without a default name its label feeds."""
    if recipe.loss.torch is None:
        raise RecipeError("loss.torch", "a 'module:callable' PyTorch twin of the custom onnxblock loss "
                          f"{recipe.loss.factory} (training.runtime = 'autograd' differentiates PyTorch, not onnxblock)")  # fmt: skip
    twin = load_ref(recipe.base_dir, recipe.loss.torch, "loss.torch")
    params = list(inspect.signature(twin).parameters.values())
    labels = [p.name for p in params[len(outputs) :] if p.default is inspect.Parameter.empty]
    if len(params) < len(outputs) or not labels:
        raise RecipeError("loss.torch", f"a callable taking the {len(outputs)} model outputs and then its label "
                          "feeds by name (parameters with a default are no feeds)",
                          f"{recipe.loss.torch}({', '.join(p.name for p in params)})")  # fmt: skip
    examples = [(n, _example(recipe, n, len(recipe.model.input_names) + i, batch, None, None))
                for i, n in enumerate(labels)]  # fmt: skip
    return LossPlan(lambda o, lab: (twin(*o, *lab), o), examples, names, f"custom:{recipe.loss.factory}")


def _example(recipe: Recipe, name: str, position: int, batch: int, fallback: np.ndarray | None,
             dtype: Any) -> Any:  # fmt: skip
    """``batch`` rows of the recipe's data for label feed ``name`` (its ``[data].feeds`` key, ``y``
    in second place), as ``dtype`` (an integer array as int64, else float32, when None); the
    ``fallback`` when the data has no such array (an error when there is none)."""
    import torch  # torch (heavy) only when a PyTorch model is built or run

    sample = recipe_sample(recipe)
    data = sample.array_for(name, position) if sample is not None else None
    if data is not None and len(data) and (fallback is None or data.shape[1:] == fallback.shape[1:]):
        rows = data[np.arange(batch) % len(data)]
    elif fallback is not None:
        rows = fallback
    else:
        raise RecipeError(
            f"data.feeds.{name}", "an array of the recipe's data for the loss's label feed", None
        )
    if dtype is None:
        dtype = np.int64 if rows.dtype.kind in "iub" else np.float32
    return torch.from_numpy(np.ascontiguousarray(rows, dtype=dtype))
