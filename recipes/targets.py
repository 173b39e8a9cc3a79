"""Reference models that must reach a quality train until held-out data says they have.

A training trajectory is not a constant: float rounding differs between CPUs (AVX512, AVX2, the
plain kernels) and thread counts, so a fixed number of epochs tuned on one machine hands another
machine a different model (the digits teacher's 12 epochs: 0.91 accuracy on the shifted test set
with AVX512 kernels, 0.81 with ``ATEN_CPU_CAPABILITY=default``). A reference model states what it
must reach (:class:`Target`) and trains epoch by epoch until a held-out set that no test set uses
shows it, within a bounded number of epochs; one that never does stops ``[data].make`` with one
line naming the model, its best held-out figure and its target. What it reached is saved beside
the model (``<file>.fit.json``), so a test or a person can read it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tasks.errors import DataError


@dataclass(frozen=True)
class Target:
    """What a reference model must reach on held-out data, and the epochs it may take."""

    what: str  # the model, for messages: "the digits teacher"
    metric: str  # what ``score`` measures: "accuracy on 300 held-out shifted digits"
    value: float  # the score it must reach (higher is better)
    max_epochs: int  # never more epochs than this
    min_epochs: int = 1  # never fewer (its learning rate has decayed by then)


@dataclass(frozen=True)
class Fit:
    """What a reference model reached: its held-out score after each epoch, the last one met the target."""

    what: str
    metric: str
    target: float
    score: float
    epochs: int
    history: list[float]

    def line(self) -> str:
        """One line for the make's log."""
        return (
            f"  {self.what}: held-out {self.metric} {self.score:.3f} >= {self.target} "
            f"after {self.epochs} epochs"
        )

    def save(self, model_file: Path) -> Path:
        """Write the fit as ``<model_file without suffix>.fit.json`` and return that path."""
        path = Path(model_file).with_suffix(".fit.json")
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path


def train_to_target(
    model: nn.Module, epoch: Callable[[int], None], score: Callable[[], float], target: Target
) -> Fit:
    """Run ``epoch(i)`` (one pass over the training data, ``model`` in train mode) and then
    ``score()`` (``model`` in eval mode) until the score reaches ``target.value``, no sooner than
    ``target.min_epochs``; ``model`` is left in eval mode. Raises DataError after
    ``target.max_epochs`` epochs that never reached it."""
    history: list[float] = []
    for i in range(target.max_epochs):
        model.train()
        epoch(i)
        model.eval()
        history.append(round(float(score()), 6))
        if i + 1 >= target.min_epochs and history[-1] >= target.value:
            return Fit(target.what, target.metric, target.value, history[-1], i + 1, history)
    best = int(np.argmax(history))
    raise DataError(
        f"[data].make: {target.what} never reached its target: held-out {target.metric} "
        f"{history[best]:.3f} at best (epoch {best + 1} of {target.max_epochs}), expected >= "
        f"{target.value}; its training (learning rate, epochs, data) in the recipe folder needs a change"
    )


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, batch: int = 512) -> float:
    """Top-1 accuracy of ``model`` (in its current mode, no gradients) on ``(x, y)``."""
    right = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logits = model(torch.from_numpy(np.ascontiguousarray(x[i : i + batch])))
            right += int((logits.argmax(1).numpy() == y[i : i + batch]).sum())
    return right / len(x)


def fit_classifier(
    model: nn.Module,
    data: Callable[[int], tuple[np.ndarray, np.ndarray]],
    heldout: tuple[np.ndarray, np.ndarray],
    target: Target,
    *,
    lr: float,
    decay: float = 1.0,
    batch: int = 64,
    seed: int = 0,
) -> Fit:
    """Train a classifier with Adam and cross-entropy until its accuracy on ``heldout`` reaches
    ``target`` (:func:`train_to_target`). ``data(epoch)`` gives that epoch's training arrays (the
    same each time, or fresh augmentations); the learning rate is multiplied by ``decay`` after
    each epoch, so the model settles instead of ending wherever a constant rate's noise left it;
    batches are shuffled by ``seed``."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.ExponentialLR(opt, decay)
    gen = torch.Generator().manual_seed(seed)

    def epoch(i: int) -> None:
        x, y = (torch.from_numpy(a) for a in data(i))
        for idx in torch.randperm(len(x), generator=gen).split(batch):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        schedule.step()

    return train_to_target(model, epoch, lambda: accuracy(model, *heldout), target)
