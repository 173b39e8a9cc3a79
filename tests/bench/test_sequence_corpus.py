"""The sequence corpus benchmark on its seeded sample of three (``--quick 3 --seed 132``): a DS-CNN
over ``torch.stft``'s spectrogram (its window a registered buffer), a stacked bidirectional ReLU
``nn.RNN`` (ONNX Runtime has no RNN gradient: its trained layer is unrolled over the steps) and a
time-major LSTM from a learned initial state, each prepared as a classifier of
accelerometer windows with the default strategy under ``ort-training`` (whose fix-ups it checks):
every row passes or stops with one specific line,
none is raw, and the counts are torch's (no buffer counts as a parameter)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.sequence_corpus import CORPUS
from bench.sequence_zoo import build
from tests.bench.corpus_kit import sample_rows
from tests.fixtures_prepare import needs_ort_training

pytestmark = pytest.mark.slow


def test_a_seeded_sample_of_the_corpus_passes_or_stops_in_one_line(tmp_path: Path) -> None:
    needs_ort_training()
    rows = sample_rows("sequence_corpus.py", 3, 132, tmp_path, "ort-training")
    assert set(rows) == {"birnn-relu-stacked", "dscnn-stft", "lstm-time-major-h0"}
    assert all(r["kind"] == "pass" for r in rows.values()), [r["message"] for r in rows.values()]
    assert (
        rows["birnn-relu-stacked"]["fixups"]["rnns_unrolled"] == 1
    )  # the last layer; the first stays frozen
    kind, args = CORPUS["dscnn-stft"]
    stft = build(kind, **args)
    assert rows["dscnn-stft"]["params"] == sum(p.numel() for p in stft.parameters())  # the window is a buffer
