"""Sequence, audio and token idioms of the generated corpus (issue 37): a spec with a ``family``
builds one of these models and its data; a spec without one is an image classifier of
tests/corpus/blocks.py.

Families: ``tokens`` (int64 token ids -> Embedding, with a padding id or not -> GRU/LSTM, uni- or
bidirectional, stacked with dropout or not -> mean or last step -> Linear), ``conv_rnn`` (a Conv1d
front end over [N, 3, T] signals, one layer or wav2vec's strided stack with GroupNorm and GELU, then
a GRU/LSTM, then a Linear), ``audio`` (raw frames through registered DFT and mel buffers, log-mel,
then a Conv1d or a GRU over the frames, Linear), ``dscnn`` (keyword spotting's depthwise-separable
CNN with BatchNorm, from random init, on loud and quiet 'spectrograms' whose statistics the init
does not fit).

:func:`expected` says what prepare must do with each spec: ``pass``, or the one line (a regex) the
recipe is refused with: a frozen recurrent layer between trainable ones, a buffer named as a
parameter.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

VOCAB, LENGTH, FRAMES, FFT = 30, 8, 6, 16


class Recurrent(nn.Module):
    def __init__(self, cin: int, spec: dict):
        super().__init__()
        cls = nn.GRU if spec["rnn"] == "gru" else nn.LSTM
        self.bidirectional = spec.get("bidirectional", False)
        self.rnn = cls(cin, 8, spec.get("layers", 1), batch_first=True, bidirectional=self.bidirectional,
                       dropout=spec.get("dropout", 0.0))  # fmt: skip
        self.pool = spec.get("pool", "mean")
        self.out = 16 if self.bidirectional else 8

    def forward(self, x):
        y = self.rnn(x)[0]
        return y.mean(1) if self.pool == "mean" else y[:, -1]


class TokenNet(nn.Module):
    def __init__(self, spec: dict, classes: int):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8, padding_idx=0 if spec.get("padding") else None)
        self.seq = Recurrent(8, spec)
        self.fc = nn.Linear(self.seq.out, classes)

    def forward(self, x):
        return self.fc(self.seq(self.emb(x)))


class ConvRecurrent(nn.Module):
    def __init__(self, spec: dict, classes: int):
        super().__init__()
        if spec.get("front") == "strided":  # wav2vec's feature encoder: strided convs, GroupNorm, GELU
            self.conv = nn.Sequential(
                nn.Conv1d(3, 8, 3, 2, 1), nn.GroupNorm(1, 8), nn.GELU(), nn.Conv1d(8, 8, 3, 2, 1)
            )
        else:
            self.conv = nn.Conv1d(3, 8, 3, padding=1)
        self.seq = Recurrent(8, spec)
        self.fc = nn.Linear(self.seq.out, classes)

    def forward(self, x):
        return self.fc(self.seq(F.relu(self.conv(x)).transpose(1, 2)))


class MelFrontEnd(nn.Module):
    """|DFT|^2 of each frame through registered cos/sin matrices, a mel filterbank, log."""

    def __init__(self, mels: int):
        super().__init__()
        t, k = torch.arange(FFT).float(), torch.arange(FFT // 2 + 1).float()
        angle = 2 * torch.pi * k[:, None] * t[None] / FFT
        self.register_buffer("cos", torch.cos(angle))
        self.register_buffer("sin", torch.sin(angle))
        self.register_buffer(
            "mel", torch.rand(mels, FFT // 2 + 1, generator=torch.Generator().manual_seed(0))
        )

    def forward(self, frames):
        power = (frames @ self.cos.T) ** 2 + (frames @ self.sin.T) ** 2
        return torch.log(power @ self.mel.T + 1e-3).transpose(1, 2)


class AudioNet(nn.Module):
    def __init__(self, spec: dict, classes: int):
        super().__init__()
        self.frontend = MelFrontEnd(spec.get("mels", 4))
        self.gru = spec.get("head") == "gru"  # a GRU over the log-mel frames, else a Conv1d
        mels = spec.get("mels", 4)
        self.body = nn.GRU(mels, 8, batch_first=True) if self.gru else nn.Conv1d(mels, 8, 3, padding=1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        mel = self.frontend(x)
        if self.gru:
            return self.fc(self.body(mel.transpose(1, 2))[0].mean(1))
        return self.fc(F.relu(self.body(mel)).mean(2))


class DSCNN(nn.Module):
    def __init__(self, spec: dict, classes: int):
        super().__init__()
        w = 8
        layers: list[nn.Module] = [nn.Conv2d(1, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
        for _ in range(spec.get("blocks", 2)):
            layers += [nn.Conv2d(w, w, 3, 1, 1, groups=w, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                       nn.Conv2d(w, w, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]  # fmt: skip
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(w, classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


MODELS = {"tokens": TokenNet, "conv_rnn": ConvRecurrent, "audio": AudioNet, "dscnn": DSCNN}
SHAPES = {"tokens": [LENGTH], "conv_rnn": [3, 12], "audio": [FRAMES, FFT], "dscnn": [1, 12, 8]}


def rnn_spec() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({
        "rnn": st.sampled_from(["gru", "lstm"]), "bidirectional": st.booleans(),
        "layers": st.sampled_from([1, 1, 2]), "dropout": st.sampled_from([0.0, 0.3]),
        "pool": st.sampled_from(["mean", "last"]),
    })  # fmt: skip


@st.composite
def sequence_architectures(draw: st.DrawFn) -> dict:
    """A spec of one family with a trainable choice: a strategy, or names/patterns a user might write."""
    family = draw(st.sampled_from(sorted(MODELS)))
    spec: dict = {"family": family, "loss": "cross-entropy"}
    if family in ("tokens", "conv_rnn"):
        spec |= draw(rnn_spec())
        if family == "tokens":
            spec["padding"] = draw(st.booleans())
        else:
            spec["front"] = draw(st.sampled_from(["single", "strided"]))
        spec["strategy"] = draw(st.sampled_from(["last-conv+classifier", "all", "classifier", "frozen-rnn"]))
    elif family == "audio":
        spec["mels"] = draw(st.sampled_from([4, 6]))
        spec["head"] = draw(st.sampled_from(["conv", "gru"]))
        spec["strategy"] = draw(st.sampled_from(["last-conv+classifier", "all", "buffer-named"]))
    else:
        spec["blocks"] = draw(st.sampled_from([1, 2, 3]))
        spec["strategy"] = draw(st.sampled_from(["last-conv+classifier", "classifier"]))
        spec["batchnorm_calibration"] = draw(st.sampled_from([0, 32]))
    return spec


def build(spec: dict, classes: int) -> nn.Module:
    """The spec's model: a family's, else an image classifier of tests/corpus/blocks.py."""
    if "family" not in spec:
        from tests.corpus.blocks import Generated

        return Generated(spec, classes)
    torch.manual_seed(0)
    return MODELS[spec["family"]](spec, classes)


def make_data(spec: dict, out_dir: Path) -> None:
    """train.npz (48) and test.npz (24) for the spec: 4 classes a model of its family can tell apart."""
    rng = np.random.default_rng(0)
    family = spec.get("family", "image")
    for name, n in (("train", 48), ("test", 24)):
        if family == "tokens":
            x = rng.integers(0, VOCAB, (n, LENGTH))
            y = (x < VOCAB // 4).sum(1).clip(0, 3)
        elif family == "image":
            size = spec["size"]
            x = rng.standard_normal((n, 3, size, size)).astype(np.float32)
            y = (x[:, 0].mean((1, 2)) > 0).astype(np.int64) * 2 + (x[:, 1].mean((1, 2)) > 0)
        else:
            y = rng.integers(0, 4, n)
            x = rng.standard_normal((n, *SHAPES[family])) * (0.5 + y).reshape(-1, *[1] * len(SHAPES[family]))
            x = 4 * x + 2 if family == "dscnn" else x  # statistics a fresh BatchNorm does not fit
        np.savez(out_dir / f"{name}.npz", x=x.astype(np.int64 if family == "tokens" else np.float32),
                 y=np.asarray(y, np.int64))  # fmt: skip


def model_fields(spec: dict) -> dict:
    """The recipe's [model] fields that depend on the family: input shape and dtype."""
    family = spec.get("family")
    if family is None:
        return {"input_shape": [3, spec["size"], spec["size"]]}
    return {"input_shape": SHAPES[family], "input_dtype": "int64" if family == "tokens" else "float32"}


def trainable_fields(spec: dict) -> dict:
    """The recipe's [trainable] table of a family spec (the strategy names some user choices)."""
    strategy = spec["strategy"]
    fields: dict = (
        {"batchnorm_calibration": spec["batchnorm_calibration"]} if spec.get("batchnorm_calibration") else {}
    )
    if strategy == "frozen-rnn":  # what precedes the recurrent layer and the classifier train, not it
        first = "emb.*" if spec["family"] == "tokens" else "conv.*"
        return fields | {"patterns": [first, "fc.*"]}
    if strategy == "buffer-named":
        return fields | {"names": ["fc.weight", "frontend.mel"]}
    return fields | {"strategy": strategy}


def expected(spec: dict) -> str:
    """``pass``, or a regex of the one line prepare must stop with."""
    if spec.get("strategy") == "frozen-rnn":
        op = spec["rnn"].upper()
        return rf"the {op} layer 'seq.rnn' \(ONNX node '/seq/rnn/{op}[^']*'\) to train whenever .*\(trainable\.train_from = '/seq/rnn/{op}"
    if spec.get("strategy") == "buffer-named":
        return r"'frontend.mel' is a registered buffer of the model .* never train"
    return "pass"
