"""Sequence corpus benchmark: sequence and audio model idioms (bench/sequence_zoo.py: 1-D CNNs, TCNs,
an SE-ResNet-1D, a DS-CNN keyword spotter over a log-mel front end held in buffers or over
``torch.stft``, LSTMs, GRUs and RNNs uni- and bidirectional, stacked with dropout, with projections,
time-major, conv + GRU, a transformer encoder over windows, a conv over ``torch.fft.rfft``) through
``prepare`` as classifiers of accelerometer windows ``[3, 64]`` (``recipes/sequences.py:windows``,
the sequence recipe's board domain), with the default strategy ``last-conv+classifier`` (the last
conv or recurrent layer and the classifier) and the validation whose probe trains a few steps on
the board's runtime; classified pass / specific (one line of the host error tree) / raw.

Models with BatchNorm re-measure its statistics on the training windows
(``trainable.batchnorm_calibration``): a random init's statistics do not fit the data.

    .venv/bin/python bench/sequence_corpus.py                       # the whole corpus (~1.5 min on 2 cores)
    .venv/bin/python bench/sequence_corpus.py --quick 3 --seed 132  # a seeded sample (the tests' smoke)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._corpus import sequence_corpus_main  # noqa: E402

# name -> (sequence_zoo kind, its arguments)
CORPUS: dict[str, tuple[str, dict]] = {
    "conv1d-bn": ("conv1d", {}),
    "tcn-dilated": ("tcn", {}),
    "tcn-weight-norm": ("tcn", {"weight_norm": True}),
    "dscnn-logmel": ("dscnn", {}),
    "dscnn-stft": ("dscnn", {"frontend": "stft"}),
    "lstm-last": ("recurrent", {"cell": "lstm"}),
    "gru-mean": ("recurrent", {"cell": "gru", "pool": "mean"}),
    "bilstm-mean": ("recurrent", {"cell": "lstm", "bidirectional": True, "pool": "mean"}),
    "gru-stacked-dropout": ("recurrent", {"cell": "gru", "layers": 2, "dropout": 0.2}),
    "bigru-stacked-attention": (
        "recurrent",
        {"cell": "gru", "layers": 2, "bidirectional": True, "dropout": 0.1, "pool": "attention"},
    ),  # fmt: skip
    "logmel-lstm": ("recurrent", {"cell": "lstm", "frontend": "mel"}),
    "lstm-projected": ("recurrent", {"cell": "lstm", "proj_size": 16}),
    "rnn-tanh": ("recurrent", {"cell": "rnn", "pool": "mean"}),
    "birnn-relu-stacked": (
        "recurrent",
        {"cell": "rnn", "layers": 2, "bidirectional": True, "nonlinearity": "relu"},
    ),
    "conv-gru": ("conv-gru", {}),
    "transformer-windows": ("transformer", {}),
    "rfft-conv": ("spectrum", {}),
    "se-resnet1d": ("se-resnet", {}),
    "lstm-time-major-h0": ("time-major-lstm", {}),
}


if __name__ == "__main__":
    sys.exit(sequence_corpus_main(__doc__, "sequence_zoo", CORPUS, __file__))
