"""Token corpus benchmark: token model idioms (bench/token_zoo.py: bags of embeddings, fastText's
EmbeddingBag, scores against tied embedding rows, a text CNN, LSTMs and GRUs with final-state, mean
and attention pooling, a GRU over packed sequences, transformer encoders written by hand and torch's
with a key padding mask) through ``prepare`` as classifiers of 16 int64 token ids
(``model.input_dtype = "int64"``; ``recipes/sequences.py:utterances``, the token recipe's board
domain), with the default strategy ``last-conv+classifier`` and the validation whose probe trains a
few steps on the board's runtime; classified pass / specific (one line of the host error tree) / raw.

The hand-written encoders stand for BERT's idioms (embeddings, post-norm blocks, tanh pooler);
``transformers``' own BERT, DistilBERT, ALBERT, RoBERTa and ELECTRA, built from configs, are swept
by bench/hf_corpus.py (the ``bench`` extra).

    .venv/bin/python bench/token_corpus.py                       # the whole corpus (~1 min on 2 cores)
    .venv/bin/python bench/token_corpus.py --quick 3 --seed 100  # a seeded sample (the tests' smoke)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._corpus import sequence_corpus_main  # noqa: E402

# name -> (token_zoo kind, its arguments)
CORPUS: dict[str, tuple[str, dict]] = {
    "embedding-mean": ("bag", {}),
    "embedding-masked-max": ("bag", {"pool": "max"}),
    "fasttext-embeddingbag": ("fasttext", {}),
    "textcnn": ("textcnn", {}),
    "lstm-final-state": ("recurrent", {"cell": "lstm"}),
    "bigru-mean": ("recurrent", {"cell": "gru", "bidirectional": True, "pool": "mean"}),
    "lstm-stacked-dropout-attention": (
        "recurrent",
        {"cell": "lstm", "layers": 2, "dropout": 0.2, "pool": "attention"},
    ),  # fmt: skip
    "transformer-pre-norm": ("hand-transformer", {}),
    "transformer-bert-like": ("hand-transformer", {"pre_norm": False, "bert_pooler": True}),
    "torch-transformer-padding-mask": ("torch-transformer", {}),
    "gru-packed-sequence": ("packed-gru", {}),
    "tied-embedding-scores": ("tied", {}),
}


if __name__ == "__main__":
    sys.exit(sequence_corpus_main(__doc__, "token_zoo", CORPUS, __file__))
