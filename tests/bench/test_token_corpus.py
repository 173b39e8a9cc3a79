"""The token corpus benchmark on its seeded sample of three (``--quick 3 --seed 100``), each prepared
on int64 token ids with the default strategy: fastText's ``nn.EmbeddingBag`` (traced as an
embedding and a mean, not the exporter's Loop that ORT's training graph cannot take; its table is
the strategy's last layer) and a hand-written pre-norm transformer (ONNX Runtime fuses its position
Range into EmbedLayerNormalization, which the shape probe must survive) pass; a GRU over packed
sequences, which torch's exporter cannot write, stops with one line naming the layer and what to
write instead; none is raw."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.token_zoo import build
from tests.bench.corpus_kit import sample_rows

pytestmark = pytest.mark.slow


def test_a_seeded_sample_of_the_corpus_passes_or_stops_in_one_line(tmp_path: Path) -> None:
    rows = sample_rows("token_corpus.py", 3, 100, tmp_path)
    assert set(rows) == {"fasttext-embeddingbag", "gru-packed-sequence", "transformer-pre-norm"}
    assert rows["fasttext-embeddingbag"]["kind"] == rows["transformer-pre-norm"]["kind"] == "pass"
    fasttext = build("fasttext")  # every parameter: the bag's table (the last layer) and the classifier
    assert rows["fasttext-embeddingbag"]["trainable"] == sum(p.numel() for p in fasttext.parameters())
    packed = rows["gru-packed-sequence"]
    assert packed["kind"] == "specific", packed["message"]
    assert "operator gru in gru (GRU): gru is fed a packed sequence" in packed["message"]
