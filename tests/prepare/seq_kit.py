"""Small sequence, audio and token models and a way to export one through the pipeline's own export
(tests of issue 37: integer inputs, recurrent last layers, BatchNorm re-measured, buffers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

from tests.prepare.kit import merge, tiny_recipe


class TokenNet(nn.Module):
    """Token ids -> Embedding -> GRU or LSTM (uni- or bidirectional, stacked) -> mean -> Linear."""

    def __init__(self, rnn="gru", bidirectional=False, layers=1, dropout=0.0, vocab=20, dim=8, classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        cls = nn.GRU if rnn == "gru" else nn.LSTM
        self.rnn = cls(dim, dim, layers, batch_first=True, bidirectional=bidirectional, dropout=dropout)
        self.fc = nn.Linear(dim * (2 if bidirectional else 1), classes)

    def forward(self, x):
        return self.fc(self.rnn(self.emb(x))[0].mean(1))


class BagNet(nn.Module):
    """Token ids (+ learned positions) -> Embedding -> mean -> Linear -> ReLU -> Linear: no layer
    but the embedding keeps the sequence axis."""

    def __init__(self, vocab=20, dim=8, classes=3, length=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(length, dim)
        self.hidden, self.fc = nn.Linear(dim, dim), nn.Linear(dim, classes)

    def forward(self, x):
        e = self.emb(x) + self.pos(torch.arange(x.shape[1]))
        return self.fc(F.relu(self.hidden(e.mean(1))))


class BagOfIds(nn.Module):
    """fastText's classifier: ``nn.EmbeddingBag`` over 2-D token ids (bags of one length) -> Linear."""

    def __init__(self, mode="mean", vocab=20, dim=8, classes=3):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, dim, mode=mode)
        self.fc = nn.Linear(dim, classes)

    def forward(self, x):
        return self.fc(self.bag(x))


class PackedEncoder(nn.Module):
    def __init__(self, vocab=20, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)

    def forward(self, x):
        lengths = (x != 0).sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            self.emb(x), lengths, batch_first=True, enforce_sorted=False
        )
        return self.rnn(packed)[1][-1]


class PackedNet(nn.Module):
    """Token ids -> encoder (Embedding -> a GRU over ``pack_padded_sequence``, lengths from padding
    id 0) -> its final state -> Linear."""

    def __init__(self, classes=3):
        super().__init__()
        self.encoder, self.fc = PackedEncoder(), nn.Linear(8, classes)

    def forward(self, x):
        return self.fc(self.encoder(x))


class Encoder(nn.Module):
    def __init__(self, rnn="gru"):
        super().__init__()
        self.conv = nn.Conv1d(3, 8, 3, padding=1)
        self.gru = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN}[rnn](8, 8, batch_first=True)

    def forward(self, x):
        return self.gru(F.relu(self.conv(x)).transpose(1, 2))[0]


class ConvGRU(nn.Module):
    """[N, 3, T] signals -> encoder (Conv1d -> GRU, LSTM or RNN) -> last step -> Linear."""

    def __init__(self, rnn="gru", classes=3):
        super().__init__()
        self.encoder = Encoder(rnn)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        return self.fc(self.encoder(x)[:, -1])


class MelNet(nn.Module):
    """Frames [N, F, n] -> registered DFT and mel buffers -> log-mel -> Conv1d -> Linear."""

    def __init__(self, n=16, mels=4, classes=3):
        super().__init__()
        t, k = torch.arange(n).float(), torch.arange(n // 2 + 1).float()
        angle = 2 * torch.pi * k[:, None] * t[None] / n
        self.register_buffer("cos", torch.cos(angle))
        self.register_buffer("sin", torch.sin(angle))
        self.register_buffer("mel", torch.rand(mels, n // 2 + 1, generator=torch.Generator().manual_seed(0)))
        self.conv = nn.Conv1d(mels, 4, 3, padding=1)
        self.fc = nn.Linear(4, classes)
        self.unused = nn.Linear(2, 2)  # never called: torch counts it, the export drops it

    def forward(self, x):
        power = (x @ self.cos.T) ** 2 + (x @ self.sin.T) ** 2
        feats = torch.log(power @ self.mel.T + 1e-3).transpose(1, 2)
        return self.fc(F.relu(self.conv(feats)).mean(2))


def export_module(
    module: nn.Module, folder: Path, x: np.ndarray, changes: dict | None = None, classes: int = 3
):
    """(recipe, exported ONNX model) of ``module`` through :func:`tasks.prepare.export.torchscript.export_torch`,
    with ``x`` (and labels) written as the recipe's train and test data."""
    from tasks.prepare.export.torchscript import export_torch

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    y = np.arange(len(x)) % classes
    for name in ("train", "test"):
        np.savez(folder / "data" / f"{name}.npz", x=x, y=y.astype(np.int64))
    base = {"model": {"input_shape": list(x.shape[1:]), "input_dtype": str(x.dtype), "num_classes": classes}}
    recipe = tiny_recipe(folder, merge(base, changes or {}))
    path = export_torch(recipe, module, folder / "model.onnx")
    return recipe, onnx.load(str(path))


def token_ids(n: int = 8, length: int = 6, vocab: int = 20) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab, (n, length)).astype(np.int64)


def signals(n: int = 8, channels: int = 3, length: int = 10) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, channels, length)).astype(np.float32)


def _separable(width: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(width, width, 3, padding=1, groups=width, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, width, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    )


class DSCNN(nn.Module):
    """Keyword spotting's depthwise-separable CNN on [N, 1, T, F] features: a strided conv stem,
    ``blocks`` depthwise + pointwise blocks, each conv followed by BatchNorm, Dropout, average
    pooling and a Linear classifier."""

    def __init__(self, blocks: int = 4, width: int = 16, classes: int = 4, dropout: float = 0.2):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.blocks = nn.Sequential(*(_separable(width) for _ in range(blocks)))
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(width, classes)

    def features(self, x):
        return self.drop(self.blocks(self.stem(x)).mean((2, 3)))

    def forward(self, x):
        return self.fc(self.features(x))
