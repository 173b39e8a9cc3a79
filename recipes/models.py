"""Reference models of the recipes in this folder (``models:<callable>`` in a recipe).

A recipe's ``models:<callable>`` resolves to the ``models.py`` beside that recipe, and while it
loads and its callables run the recipe's folder is first on the import path
(``tasks.prepare.export.torch_model.recipe_import_path``): a copy of this file next to a user's recipe
works the same way and may import sibling modules or packages of that folder. Host-side only:
torch and onnxruntime.training.onnxblock are fine here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class DigitsCNN(nn.Module):
    """A small CNN for 1x8x8 digits: two conv+BN blocks, a pool and a linear classifier."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 4 * 4, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The convolutional trunk, flattened."""
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return torch.flatten(x, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def digits_cnn(num_classes: int = 10) -> nn.Module:
    """The digits recipe's model (base weights come from the recipe's ``weights`` file)."""
    return DigitsCNN(num_classes)


def pretrain_digits(
    x: np.ndarray, y: np.ndarray, heldout: tuple[np.ndarray, np.ndarray], out: Path, *, seed: int = 0
) -> Path:
    """Pretrain :class:`DigitsCNN` on clean digits until it classifies ``heldout`` (clean digits it
    does not train on) at DIGITS_BASE_TARGET, save its state_dict to ``out`` and what it reached
    beside it (``.fit.json``)."""
    from targets import fit_classifier  # recipes/targets.py: the recipe folder is on the path

    torch.manual_seed(seed)
    model = DigitsCNN(10)
    target = digits_target("the digits student's pretraining", "clean", DIGITS_BASE_TARGET, heldout, 12)
    fit = fit_classifier(model, lambda _: (x, y), heldout, target, lr=3e-3, decay=0.85, seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    print(fit.line(), f"({fit.save(out).name})", flush=True)
    return out


DIGITS_BASE_TARGET = 0.96  # the student's held-out clean accuracy (it settles at ~0.99)
DIGITS_TEACHER_TARGET = 0.88  # the teacher's held-out shifted accuracy (it settles at ~0.91)


def digits_target(
    what: str, kind: str, value: float, heldout: tuple[np.ndarray, np.ndarray], min_epochs: int
):
    """A digits model's :class:`targets.Target`: ``value`` accuracy on the ``heldout`` digits of
    ``kind``, after at least ``min_epochs`` (its rate has decayed to a seventh or less), at most 30."""
    from targets import Target

    return Target(what, f"accuracy on {len(heldout[1])} {kind} digits", value, 30, min_epochs)


class DigitsTeacher(nn.Module):
    """A larger digits CNN (about 20x the student's parameters): the teacher of ``digits_teacher``."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(128, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.Flatten(),
            nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, num_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def train_digits_teacher(
    data: Callable[[int], tuple[np.ndarray, np.ndarray]],
    heldout: tuple[np.ndarray, np.ndarray],
    out: Path,
    *,
    seed: int = 0,
) -> Path:
    """Train :class:`DigitsTeacher` on ``data(epoch)`` (fresh augmentations each epoch) until it
    classifies ``heldout`` (shifted digits) at DIGITS_TEACHER_TARGET, export it to ONNX (opset 17,
    dynamic batch) and save what it reached beside it (``.fit.json``)."""
    from targets import fit_classifier  # recipes/targets.py: the recipe folder is on the path

    torch.manual_seed(seed)
    model = DigitsTeacher(10)
    target = digits_target("the digits teacher", "shifted", DIGITS_TEACHER_TARGET, heldout, 12)
    fit = fit_classifier(model, data, heldout, target, lr=2e-3, decay=0.85, seed=seed)
    xt = torch.from_numpy(heldout[0][:2])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.onnx")
    torch.onnx.export(model, (xt,), str(tmp), input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}}, opset_version=17, dynamo=False)  # fmt: skip
    tmp.replace(out)
    print(fit.line(), f"({fit.save(out).name})", flush=True)
    return out


class TwoHead(nn.Module):
    """Digits CNN with two outputs: class logits and an auxiliary regression (ink amount)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.trunk = DigitsCNN(num_classes)
        self.aux = nn.Linear(32 * 4 * 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.trunk.features(x)
        return self.trunk.fc(f), self.aux(f)


def two_head(num_classes: int = 10) -> nn.Module:
    """The custom-loss recipe's two-output model."""
    return TwoHead(num_classes)


def two_head_loss(class_weight: float = 1.0, aux_weight: float = 0.5):
    """An onnxblock loss: ``class_weight * CE(logits, labels) + aux_weight * MSE(aux, target)``."""
    from onnxruntime.training import onnxblock

    class TwoHeadLoss(onnxblock.Block):
        def __init__(self) -> None:
            super().__init__()
            self.ce = onnxblock.loss.CrossEntropyLoss()
            self.mse = onnxblock.loss.MSELoss()
            self.wa, self.wb = onnxblock.blocks.Constant(class_weight), onnxblock.blocks.Constant(aux_weight)
            self.mul_a, self.mul_b = onnxblock.blocks.Mul(), onnxblock.blocks.Mul()
            self.add = onnxblock.blocks.Add()

        def build(self, logits: str, aux: str) -> str:
            loss_a = self.mul_a(self.ce(logits, "labels"), self.wa())
            loss_b = self.mul_b(self.mse(aux, "target"), self.wb())
            return self.add(loss_a, loss_b)

    return TwoHeadLoss()


def two_head_loss_torch(logits: torch.Tensor, aux: torch.Tensor, labels: torch.Tensor, target: torch.Tensor,
                        class_weight: float = 1.0, aux_weight: float = 0.5) -> torch.Tensor:  # fmt: skip
    """:func:`two_head_loss` in PyTorch, its twin for ``training.runtime = "autograd"`` (``loss.torch``):
    the model's outputs, then the label feeds by their graph names."""
    return class_weight * F.cross_entropy(logits, labels) + aux_weight * ((aux - target) ** 2).mean()


class EmbeddedLossNet(DigitsCNN):
    """Digits CNN whose forward takes ``(input, labels)`` and returns ``(loss, logits)``.

    Same parameter names as :class:`DigitsCNN`, so the pretrained digits weights load into it.
    """

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        logits = super().forward(x)
        return F.cross_entropy(logits, labels), logits


def embedded_loss_net(num_classes: int = 10) -> nn.Module:
    """The embedded-loss recipe's model (loss computed inside the graph)."""
    return EmbeddedLossNet(num_classes)


def mobilenet_v2_features(
    out: Path,
    *,
    size: int = 64,
    max_steps: int = 240,
    target: float = 0.9,
    batch: int = 32,
    seed: int = 0,
) -> str:
    """Weights for the STM32 wiki recipe's MobileNetV2 that are not random: ImageNet's from
    torchvision's hub cache when a user has them (``torch.hub.get_dir()/checkpoints``; nothing is
    downloaded), else a short pretraining on this host on generated textures of *another* task
    (four classes: stripes at 45 and 135 degrees, checkerboards, dots) at ``size`` px, until it
    classifies ``target`` of a held-out batch of them (checked every PRETEXT_CHECK_EVERY steps, at
    most ``max_steps``), so the backbone's filters respond to oriented edges before the board
    fine-tunes a new 2-class head. Its BatchNorm statistics are measured on the recipe's own images
    by the recipe (``[trainable] batchnorm_calibration``: statistics of 64 px textures would
    misnormalise 224 px images). Prints one line with its seconds.
    Saves a state_dict (classifier included; its shape differs and is replaced) and returns where
    the weights came from, for the log."""
    import glob
    import os

    cached = sorted(glob.glob(os.path.join(torch.hub.get_dir(), "checkpoints", "mobilenet_v2-*.pth")))
    out.parent.mkdir(parents=True, exist_ok=True)
    if cached:
        torch.save(torch.load(cached[-1], map_location="cpu", weights_only=True), out)
        return f"ImageNet weights from torchvision's hub cache ({cached[-1]})"
    threads = torch.get_num_threads()
    torch.set_num_threads(free_cores(threads))
    try:
        start = time.perf_counter()
        model, steps, accuracy = pretrain_pretext(size, max_steps, target, batch, seed)
        print(f"  pretraining on generated textures: {steps} steps at {size} px, held-out accuracy "
              f"{accuracy:.2f} ({time.perf_counter() - start:.1f} s, {torch.get_num_threads()} threads)", flush=True)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    torch.save(model.eval().state_dict(), out)
    return f"a {steps}-step pretraining on generated textures on this host (no ImageNet weights cached)"


PRETEXT_CHECK_EVERY = 20  # steps between checks of the pretraining's held-out accuracy


def pretrain_pretext(
    size: int, max_steps: int, target: float, batch: int = 32, seed: int = 0
) -> tuple[nn.Module, int, float]:
    """A 4-class MobileNetV2 trained on :func:`pretext_textures` with AdamW until its accuracy on a
    held-out batch of 128 (in eval mode) reaches ``target`` or ``max_steps`` ran: (model, steps,
    that accuracy)."""
    import torchvision

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    held_x, held_y = pretext_textures(np.random.default_rng(seed + 1), 128, size)
    model = torchvision.models.mobilenet_v2(num_classes=4)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    step, accuracy, reached = 0, 0.0, False
    while step < max_steps and not reached:
        model.train()
        x, y = pretext_textures(rng, batch, size)
        opt.zero_grad()
        F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
        step += 1
        if step % PRETEXT_CHECK_EVERY == 0 or step == max_steps:
            model.eval()
            with torch.no_grad():
                accuracy = float((model(torch.from_numpy(held_x)).argmax(1).numpy() == held_y).mean())
            reached = accuracy >= target
    return model, step, accuracy


def free_cores(most: int) -> int:
    """The threads torch should use now: the cores the 1-minute load average leaves free, at least 1
    and at most ``most``. torch's OpenMP threads spin while they wait for each other, so on a busy
    machine two of them share the cores with other work and a MobileNetV2 step runs ~10x slower
    than with one thread (11 s against 1.1 s per 32-image step at load 8 on 2 cores)."""
    import os

    cores = len(os.sched_getaffinity(0))
    return max(1, min(most, round(cores - os.getloadavg()[0])))


def pretext_textures(rng: np.random.Generator, n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images of four texture classes that are not the recipe's task: diagonal stripes at 45
    and at 135 degrees, checkerboards and dot grids, random period, phase, colour and noise."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    y = rng.integers(0, 4, n)
    x = np.empty((n, 3, size, size), np.float32)
    for i in range(n):
        period, phase = rng.uniform(4, 12), rng.uniform(0, 2 * np.pi)
        k = 2 * np.pi / period
        if y[i] == 0:
            img = np.sin(k * (xx + yy) / np.sqrt(2) + phase)
        elif y[i] == 1:
            img = np.sin(k * (xx - yy) / np.sqrt(2) + phase)
        elif y[i] == 2:
            img = np.sign(np.sin(k * xx + phase) * np.sin(k * yy + phase))
        else:
            img = (np.cos(k * xx + phase) + np.cos(k * yy + phase)) / 2
        colour = rng.uniform(0.5, 1.5, 3).astype(np.float32)[:, None, None]
        x[i] = colour * img[None] + rng.normal(0, 0.3, (3, size, size))
    return x, y.astype(np.int64)
