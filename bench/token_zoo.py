"""Token model idioms for the token corpus (bench/token_corpus.py), written for it: each takes int64
token ids ``[N, L]`` (``recipes/sequences.py:utterances``) and gives class scores ``[N, C]``.

* bags of embeddings: mean pooling, and max pooling with a padding id masked out, under an MLP;
  scores against the embedding rows of the classes (a table tied between input and output);
  fastText's ``nn.EmbeddingBag`` under a Linear;
* a text CNN (Kim 2014): convolutions of widths 2, 3 and 4 over the embeddings, max over time;
* recurrent: a GRU over packed sequences (lengths from the padding id), an LSTM read at its final state, a bidirectional GRU with mean pooling, a stacked
  LSTM with dropout between layers and attention pooling;
* transformer encoders written by hand (multi-head attention from Linear layers, pre- and
  post-norm, GELU, a class token or BERT's pooler with token types) and torch's
  ``nn.TransformerEncoder`` with a key padding mask from the ids.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, LENGTH, CLASSES = 48, 16, 4
PAD = VOCAB - 1  # a filler word the masking idioms treat as padding


class BagOfEmbeddings(nn.Module):
    """Embedding, mean (or max over the non-padding positions) over the sequence, an MLP."""

    def __init__(self, num_classes: int = CLASSES, dim: int = 32, pool: str = "mean") -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, dim, padding_idx=PAD if pool == "max" else None)
        self.hidden = nn.Linear(dim, dim)
        self.classifier = nn.Linear(dim, num_classes)
        self.pool = pool

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.embedding(ids)
        if self.pool == "mean":
            pooled = e.mean(1)
        else:
            pooled = e.masked_fill((ids == PAD).unsqueeze(-1), -1e4).max(1).values
        return self.classifier(F.relu(self.hidden(pooled)))


class FastText(nn.Module):
    """fastText's classifier: ``nn.EmbeddingBag`` (the mean of the ids' vectors) and a Linear."""

    def __init__(self, num_classes: int = CLASSES, dim: int = 32) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, dim, mode="mean")
        self.classifier = nn.Linear(dim, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.bag(ids))


class TextCNN(nn.Module):
    """Embeddings as channels, Conv1d of widths 2, 3, 4 with ReLU, max over time, concatenated."""

    def __init__(self, num_classes: int = CLASSES, dim: int = 24, filters: int = 16) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, dim)
        self.convs = nn.ModuleList(nn.Conv1d(dim, filters, k) for k in (2, 3, 4))
        self.drop = nn.Dropout(0.3)
        self.classifier = nn.Linear(3 * filters, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.embedding(ids).transpose(1, 2)
        pooled = torch.cat([F.relu(conv(e)).amax(-1) for conv in self.convs], dim=1)
        return self.classifier(self.drop(pooled))


class TokenRecurrent(nn.Module):
    """Embedding, an LSTM or GRU, pooled by its final hidden state, the mean or attention."""

    def __init__(self, num_classes: int = CLASSES, cell: str = "lstm", dim: int = 16, hidden: int = 32,
                 layers: int = 1, bidirectional: bool = False, dropout: float = 0.0,
                 pool: str = "final") -> None:  # fmt: skip
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, dim)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(dim, hidden, layers, batch_first=True, bidirectional=bidirectional, dropout=dropout)
        out = hidden * (2 if bidirectional else 1)
        self.attention = (
            nn.Sequential(nn.Linear(out, 16), nn.Tanh(), nn.Linear(16, 1)) if pool == "attention" else None
        )
        self.classifier = nn.Linear(out, num_classes)
        self.cell, self.pool = cell, pool

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, state = self.rnn(self.embedding(ids))
        if self.pool == "final":
            final = state[0] if self.cell == "lstm" else state
            return self.classifier(final[-1])
        if self.pool == "mean":
            return self.classifier(h.mean(1))
        weights = torch.softmax(self.attention(h), dim=1)
        return self.classifier((weights * h).sum(1))


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product attention from one Linear for queries, keys and values."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.heads, self.head_dim = heads, dim // heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, dim = x.shape
        q, k, v = self.qkv(x).reshape(n, length, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(n, length, dim))


class EncoderBlock(nn.Module):
    """Attention and a GELU feed-forward, each with a residual and LayerNorm (before or after)."""

    def __init__(self, dim: int, heads: int, pre_norm: bool) -> None:
        super().__init__()
        self.attention, self.norm1, self.norm2 = (
            SelfAttention(dim, heads),
            nn.LayerNorm(dim),
            nn.LayerNorm(dim),
        )
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * dim, dim))
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attention(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))


class HandTransformer(nn.Module):
    """Token and learned position embeddings, a class token, ``depth`` encoder blocks, the class
    token's vector to the classifier (``bert_pooler``: a token-type embedding, an embedding
    LayerNorm and BERT's tanh pooler before it)."""

    def __init__(self, num_classes: int = CLASSES, dim: int = 32, heads: int = 4, depth: int = 2,
                 pre_norm: bool = True, bert_pooler: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, dim)
        self.position = nn.Embedding(LENGTH + 1, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.token_type = nn.Embedding(2, dim) if bert_pooler else None
        self.embed_norm = nn.LayerNorm(dim) if bert_pooler else nn.Identity()
        self.blocks = nn.Sequential(*(EncoderBlock(dim, heads, pre_norm) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim) if pre_norm else nn.Identity()
        self.pooler = nn.Sequential(nn.Linear(dim, dim), nn.Tanh()) if bert_pooler else nn.Identity()
        self.classifier = nn.Linear(dim, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.cls.expand(ids.shape[0], -1, -1), self.embedding(ids)], dim=1)
        positions = torch.arange(x.shape[1], device=ids.device)
        x = x + self.position(positions)
        if self.token_type is not None:
            x = x + self.token_type(torch.zeros_like(positions))
        x = self.norm(self.blocks(self.embed_norm(x)))
        return self.classifier(self.pooler(x[:, 0]))


class TorchTransformer(nn.Module):
    """Embedding with sinusoidal positions (a buffer), torch's TransformerEncoder with a key padding
    mask from the ids, mean over the non-padding positions."""

    def __init__(self, num_classes: int = CLASSES, dim: int = 32, depth: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, dim)
        position = torch.arange(LENGTH, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(1e4) / dim))
        table = torch.zeros(LENGTH, dim)
        table[:, 0::2], table[:, 1::2] = torch.sin(position * freq), torch.cos(position * freq)
        self.register_buffer("sinusoids", table)
        layer = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.classifier = nn.Linear(dim, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == PAD
        h = self.encoder(self.embedding(ids) * math.sqrt(self.classifier.in_features) + self.sinusoids,
                         src_key_padding_mask=pad)  # fmt: skip
        keep = (~pad).unsqueeze(-1).float()
        return self.classifier((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


class PackedGRU(nn.Module):
    """Embedding, a GRU over packed sequences (``pack_padded_sequence``, lengths counted from the
    non-padding ids), its final hidden state to the classifier."""

    def __init__(self, num_classes: int = CLASSES, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.gru = nn.GRU(dim, hidden, batch_first=True)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        lengths = (ids != PAD).sum(1).clamp(min=1)
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(ids), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)  # fmt: skip
        return self.classifier(self.gru(packed)[1][-1])


class TiedScores(nn.Module):
    """Mean of the embeddings through a Linear, scored against embedding rows reserved for the
    classes (the table shared by the input and the output, as tied language models do)."""

    def __init__(self, num_classes: int = CLASSES, dim: int = 32) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB + num_classes, dim)
        self.project = nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.zeros(num_classes))
        self.num_classes = num_classes

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pooled = torch.tanh(self.project(self.embedding(ids).mean(1)))
        return pooled @ self.embedding.weight[VOCAB:].t() + self.bias


BUILDERS = {"bag": BagOfEmbeddings, "fasttext": FastText, "textcnn": TextCNN, "recurrent": TokenRecurrent,
            "hand-transformer": HandTransformer, "torch-transformer": TorchTransformer, "packed-gru": PackedGRU,
            "tied": TiedScores}  # fmt: skip


def build(kind: str, **kwargs: object) -> nn.Module:
    """The corpus case ``kind`` with ``kwargs`` (seeded: the same weights on every machine)."""
    torch.manual_seed(0)
    return BUILDERS[kind](**kwargs)  # type: ignore[arg-type]
