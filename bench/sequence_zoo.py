"""Sequence and audio model idioms for the sequence corpus (bench/sequence_corpus.py), written for
it: each takes accelerometer-like windows ``[N, 3, T]`` (``recipes/sequences.py:windows``) and gives
class scores ``[N, C]``.

* 1-D CNNs: a plain Conv1d + BatchNorm stack with global average pooling, and a TCN (causal
  convolutions with dilations 1, 2, 4 and residual connections; optionally weight-normalised);
* keyword spotting: a DS-CNN (depthwise-separable 2-D convolutions) over a log-mel spectrogram
  computed in ``forward`` from DFT and mel matrices held as registered buffers, or over
  ``torch.stft``'s power spectrogram;
* recurrent: LSTM, GRU and a tanh RNN, uni- and bidirectional, an LSTM with projections, stacked with dropout between layers, over the
  raw steps or the spectrogram's frames, pooled by the last step, the mean or learned attention;
* conv + GRU (a strided convolution front end) and a small transformer encoder over patches;
* a Conv1d over ``torch.fft.rfft``'s magnitudes, a squeeze-excitation ResNet-1D, a time-major
  LSTM from a learned initial state.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

CHANNELS, STEPS, CLASSES = 3, 64, 4


class LogMel(nn.Module):
    """A log-mel spectrogram of each channel, ``[N, C, T] -> [N, C, mels, frames]``: a Hann-windowed
    DFT as a strided convolution and a triangular mel filterbank, both registered buffers."""

    def __init__(self, n_fft: int = 16, hop: int = 4, mels: int = 8) -> None:
        super().__init__()
        bins = n_fft // 2 + 1
        t = torch.arange(n_fft, dtype=torch.float32)
        f = torch.arange(bins, dtype=torch.float32)[:, None]
        window = 0.5 - 0.5 * torch.cos(2 * math.pi * t / n_fft)
        angle = 2 * math.pi * f * t / n_fft
        kernels = torch.cat([torch.cos(angle), -torch.sin(angle)]) * window  # [2 * bins, n_fft]
        self.register_buffer("dft", kernels[:, None, :])
        self.register_buffer("mel", self._filterbank(bins, mels))
        self.hop, self.bins = hop, bins

    @staticmethod
    def _filterbank(bins: int, mels: int) -> torch.Tensor:
        def to_mel(hz: torch.Tensor) -> torch.Tensor:
            return 2595.0 * torch.log10(1.0 + hz / 700.0)

        top = to_mel(torch.tensor(float(bins - 1)))
        edges = 700.0 * (10 ** (torch.linspace(0.0, float(top), mels + 2) / 2595.0) - 1.0)
        f = torch.arange(bins, dtype=torch.float32)
        rising = (f - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None]).clamp(min=1e-3)
        falling = (edges[2:, None] - f) / (edges[2:, None] - edges[1:-1, None]).clamp(min=1e-3)
        return torch.clamp(torch.minimum(rising, falling), min=0.0)  # [mels, bins]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, t = x.shape
        spec = F.conv1d(x.reshape(n * c, 1, t), self.dft, stride=self.hop)
        power = spec[:, : self.bins] ** 2 + spec[:, self.bins :] ** 2
        mel = torch.matmul(self.mel, power)  # [N * C, mels, frames]
        return torch.log(mel + 1e-4).reshape(n, c, mel.shape[1], mel.shape[2])


class StftPower(nn.Module):
    """A log power spectrogram of each channel with ``torch.stft`` (a Hann window as a buffer),
    ``[N, C, T] -> [N, C, bins, frames]``: torchaudio's Spectrogram written with torch alone."""

    def __init__(self, n_fft: int = 16, hop: int = 4) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(n_fft))
        self.n_fft, self.hop = n_fft, hop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, t = x.shape
        spec = torch.stft(x.reshape(n * c, t), self.n_fft, self.hop, window=self.window, center=False,
                          return_complex=False)  # fmt: skip
        power = (spec**2).sum(-1)  # [N * C, bins, frames]
        return torch.log(power + 1e-4).reshape(n, c, power.shape[1], power.shape[2])


class Conv1dNet(nn.Module):
    """Conv1d + BatchNorm + ReLU blocks (the last two strided), global average pooling, Linear."""

    def __init__(self, num_classes: int = CLASSES, width: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = CHANNELS
        for stride in (1, 2, 2):
            layers += [
                nn.Conv1d(cin, width, 5, stride, padding=2, bias=False),
                nn.BatchNorm1d(width),
                nn.ReLU(),
            ]
            cin = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean(-1))


class CausalBlock(nn.Module):
    """Two causal dilated convolutions (left padding only) with a residual connection."""

    def __init__(self, cin: int, cout: int, dilation: int, weight_norm: bool) -> None:
        super().__init__()
        wrap = nn.utils.parametrizations.weight_norm if weight_norm else (lambda m: m)
        self.conv1 = wrap(nn.Conv1d(cin, cout, 3, dilation=dilation))
        self.conv2 = wrap(nn.Conv1d(cout, cout, 3, dilation=dilation))
        self.shortcut = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()
        self.pad = 2 * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(F.pad(x, (self.pad, 0))))
        h = F.relu(self.conv2(F.pad(h, (self.pad, 0))))
        return F.relu(h + self.shortcut(x))


class TCN(nn.Module):
    """A temporal convolutional network (dilations 1, 2, 4), classified from its last step."""

    def __init__(self, num_classes: int = CLASSES, width: int = 24, weight_norm: bool = False) -> None:
        super().__init__()
        cins = (CHANNELS, width, width)
        self.blocks = nn.Sequential(*(CausalBlock(c, width, 2**i, weight_norm) for i, c in enumerate(cins)))
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.blocks(x)[:, :, -1])


def _separable(c: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                         nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())  # fmt: skip


class DSCNN(nn.Module):
    """Keyword spotting's DS-CNN over the log-mel spectrogram: a stem conv, depthwise-separable
    blocks, global average pooling, Linear."""

    def __init__(
        self, num_classes: int = CLASSES, width: int = 32, blocks: int = 3, frontend: str = "mel"
    ) -> None:
        super().__init__()
        self.frontend = LogMel() if frontend == "mel" else StftPower()
        self.stem = nn.Sequential(nn.Conv2d(CHANNELS, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())  # fmt: skip
        self.blocks = nn.Sequential(*(_separable(width) for _ in range(blocks)))
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(self.frontend(x)))
        return self.classifier(F.adaptive_avg_pool2d(h, 1).flatten(1))


class Recurrent(nn.Module):
    """An LSTM, GRU or tanh RNN over the steps (``frontend = "mel"``: over the spectrogram's frames;
    an LSTM with ``proj_size``: projected hidden states; an RNN's ``nonlinearity``), pooled by the last step, the mean over
    steps or attention (a learned score per step, softmax)."""

    def __init__(self, num_classes: int = CLASSES, cell: str = "lstm", hidden: int = 32, layers: int = 1,
                 bidirectional: bool = False, dropout: float = 0.0, pool: str = "last",
                 frontend: str = "none", proj_size: int = 0, nonlinearity: str = "tanh") -> None:  # fmt: skip
        super().__init__()
        self.frontend = LogMel() if frontend == "mel" else None
        features = CHANNELS * 8 if frontend == "mel" else CHANNELS
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
        extra = (
            {"proj_size": proj_size} if proj_size else {"nonlinearity": nonlinearity} if cell == "rnn" else {}
        )
        self.rnn = rnn(features, hidden, layers, batch_first=True, bidirectional=bidirectional, dropout=dropout,
                       **extra)  # fmt: skip
        out = (proj_size or hidden) * (2 if bidirectional else 1)
        self.score = nn.Linear(out, 1) if pool == "attention" else None
        self.classifier = nn.Linear(out, num_classes)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.frontend is not None:
            x = self.frontend(x).flatten(1, 2)  # [N, C * mels, frames]
        h = self.rnn(x.transpose(1, 2))[0]
        if self.pool == "last":
            return self.classifier(h[:, -1])
        if self.pool == "mean":
            return self.classifier(h.mean(1))
        weights = torch.softmax(self.score(h), dim=1)
        return self.classifier((weights * h).sum(1))


class ConvGRU(nn.Module):
    """Strided Conv1d + BatchNorm front end, a GRU over its steps, a dropout and the classifier."""

    def __init__(self, num_classes: int = CLASSES, width: int = 24, hidden: int = 32) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(CHANNELS, width, 4, stride=2, padding=1), nn.BatchNorm1d(width),
                                  nn.ReLU())  # fmt: skip
        self.gru = nn.GRU(width, hidden, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gru(self.conv(x).transpose(1, 2))[1][-1]  # the final hidden state
        return self.classifier(self.drop(h))


class WindowTransformer(nn.Module):
    """Patches of the window (a strided Conv1d) plus learned positions, torch's TransformerEncoder,
    a class token read out by the classifier."""

    def __init__(self, num_classes: int = CLASSES, dim: int = 32, patch: int = 8, depth: int = 2) -> None:
        super().__init__()
        self.patch = nn.Conv1d(CHANNELS, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.randn(1, STEPS // patch + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.classifier = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(tokens.shape[0], -1, -1), tokens], dim=1) + self.position
        return self.classifier(self.norm(self.encoder(tokens))[:, 0])


class SpectrumConv(nn.Module):
    """The magnitude of each channel's ``torch.fft.rfft`` (a frozen front end), a Conv1d over
    frequency, global max pooling (``AdaptiveMaxPool1d`` + ``Flatten``), Linear."""

    def __init__(self, num_classes: int = CLASSES, width: int = 16) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(CHANNELS, width, 3, padding="same"), nn.ReLU())
        self.pool = nn.Sequential(nn.AdaptiveMaxPool1d(1), nn.Flatten())
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.conv(torch.fft.rfft(x).abs())))


class SEBlock1d(nn.Module):
    """A residual Conv1d block with BatchNorm and squeeze-excitation of its channels."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(c, c, 3, padding=1, bias=False), nn.BatchNorm1d(c), nn.ReLU(),
                                  nn.Conv1d(c, c, 3, padding=1, bias=False), nn.BatchNorm1d(c))  # fmt: skip
        self.gate = nn.Sequential(nn.AdaptiveAvgPool1d(1), nn.Conv1d(c, c // 4, 1), nn.ReLU(), nn.Conv1d(c // 4, c, 1),
                                  nn.Sigmoid())  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return F.relu(x + h * self.gate(h))


class SEResNet1d(nn.Module):
    """A stem conv and two squeeze-excitation residual blocks, average pooling, Linear."""

    def __init__(self, num_classes: int = CLASSES, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv1d(CHANNELS, width, 5, stride=2, padding=2)
        self.blocks = nn.Sequential(SEBlock1d(width), SEBlock1d(width))
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.blocks(F.relu(self.stem(x))).mean(-1))


class TimeMajorLSTM(nn.Module):
    """A time-major LSTM (``batch_first=False``) from a learned initial state, a LayerNorm over its
    last step, Linear."""

    def __init__(self, num_classes: int = CLASSES, hidden: int = 24) -> None:
        super().__init__()
        self.lstm = nn.LSTM(CHANNELS, hidden)
        self.h0 = nn.Parameter(torch.zeros(1, 1, hidden))
        self.c0 = nn.Parameter(torch.zeros(1, 1, hidden))
        self.norm = nn.LayerNorm(hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        state = (self.h0.expand(1, n, -1).contiguous(), self.c0.expand(1, n, -1).contiguous())
        y = self.lstm(x.permute(2, 0, 1), state)[0]  # [T, N, hidden]
        return self.classifier(self.norm(y[-1]))


BUILDERS = {"conv1d": Conv1dNet, "tcn": TCN, "dscnn": DSCNN, "recurrent": Recurrent, "conv-gru": ConvGRU,
            "transformer": WindowTransformer, "spectrum": SpectrumConv, "se-resnet": SEResNet1d,
            "time-major-lstm": TimeMajorLSTM}  # fmt: skip


def build(kind: str, **kwargs: object) -> nn.Module:
    """The corpus case ``kind`` with ``kwargs`` (seeded: the same weights on every machine)."""
    torch.manual_seed(0)
    return BUILDERS[kind](**kwargs)  # type: ignore[arg-type]
