"""Reference models of the recipes in this folder (``models:<callable>`` in a recipe).

A recipe's ``models:<callable>`` resolves to the ``models.py`` beside that recipe, and while it
loads and its callables run the recipe's folder is first on the import path
(``tasks.prepare.torch_model.recipe_import_path``): a copy of this file next to a user's recipe
works the same way and may import sibling modules or packages of that folder. Host-side only:
torch and onnxruntime.training.onnxblock are fine here.
"""

from __future__ import annotations

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


def pretrain_digits(x: np.ndarray, y: np.ndarray, out: Path, *, epochs: int = 15, seed: int = 0) -> Path:
    """Pretrain :class:`DigitsCNN` on clean digits with torch and save its state_dict to ``out``."""
    torch.manual_seed(seed)
    model = DigitsCNN(10)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            F.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.eval().state_dict(), out)
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
