"""The token corpus benchmark on its seeded sample of three (``--quick 3 --seed 18``), each prepared
on int64 token ids with the default strategy: a bag of embeddings with a masked max (its token
embedding is the strategy's last layer), fastText's ``nn.EmbeddingBag`` (traced as an embedding
and a mean, not the exporter's Loop that ORT's training graph cannot take) and a hand-written
pre-norm transformer (ONNX Runtime fuses its position Range into EmbedLayerNormalization, which the
shape probe must survive): every row passes or stops with one specific line, none is raw."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.token_zoo import build
from tests.bench.corpus_kit import sample_rows

pytestmark = pytest.mark.slow


def test_a_seeded_sample_of_the_corpus_passes_or_stops_in_one_line(tmp_path: Path) -> None:
    rows = sample_rows("token_corpus.py", 3, 18, tmp_path)
    assert set(rows) == {"embedding-masked-max", "fasttext-embeddingbag", "transformer-pre-norm"}
    assert all(r["kind"] == "pass" for r in rows.values()), [r["message"] for r in rows.values()]
    bag = build("bag", pool="max")  # the embedding table and the classifier train, the hidden layer not
    want = bag.embedding.weight.numel() + sum(p.numel() for p in bag.classifier.parameters())
    assert rows["embedding-masked-max"]["trainable"] == want
    assert rows["fasttext-embeddingbag"]["trainable"] == sum(
        p.numel() for p in build("fasttext").parameters()
    )
