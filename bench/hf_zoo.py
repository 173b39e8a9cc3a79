"""Hugging Face ``transformers`` models for the transformers corpus (bench/hf_corpus.py), built from
configs written here (random init, nothing from the hub): tiny text classifiers that take int64
token ids ``[N, L]`` and image classifiers that take ``[N, 3, S, S]``, each wrapped so its forward
returns the class scores ``[N, C]`` (a ``...ForSequenceClassification`` or
``...ForImageClassification`` model returns a ``ModelOutput``; a recipe's model returns tensors).

``transformers`` is the optional ``bench`` extra (pyproject.toml), not a test or runtime dependency.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import transformers as hf
from torch import nn

TEXT_VOCAB, TEXT_LENGTH, IMAGE_SIZE = 48, 16, 32  # recipes/sequences.py's utterances; 32 px images
TEXT = {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": TEXT_VOCAB,
        "max_position_embeddings": 32}  # fmt: skip
VISION = {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "image_size": IMAGE_SIZE}


def _configs() -> dict[str, tuple[Callable[..., nn.Module], Callable[[int], object]]]:
    """name -> (model class, config of ``num_labels`` classes)."""
    return {
        "bert": (hf.BertForSequenceClassification, lambda n: hf.BertConfig(hidden_size=32, num_labels=n, **TEXT)),
        "distilbert": (hf.DistilBertForSequenceClassification, lambda n: hf.DistilBertConfig(
            dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=TEXT_VOCAB, max_position_embeddings=32,
            num_labels=n)),
        "albert": (hf.AlbertForSequenceClassification, lambda n: hf.AlbertConfig(
            embedding_size=16, hidden_size=32, num_labels=n, **TEXT)),
        "roberta": (hf.RobertaForSequenceClassification, lambda n: hf.RobertaConfig(
            hidden_size=32, num_labels=n, pad_token_id=1, **{**TEXT, "max_position_embeddings": 40})),
        "electra": (hf.ElectraForSequenceClassification, lambda n: hf.ElectraConfig(
            embedding_size=16, hidden_size=32, num_labels=n, **TEXT)),
        "vit": (hf.ViTForImageClassification, lambda n: hf.ViTConfig(
            hidden_size=32, patch_size=8, num_labels=n, **VISION)),
        "deit": (hf.DeiTForImageClassification, lambda n: hf.DeiTConfig(
            hidden_size=32, patch_size=8, num_labels=n, **VISION)),
        "mobilevit": (hf.MobileViTForImageClassification, lambda n: hf.MobileViTConfig(
            image_size=IMAGE_SIZE, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48],
            num_attention_heads=2, num_labels=n)),
        "convnext": (hf.ConvNextForImageClassification, lambda n: hf.ConvNextConfig(
            hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_labels=n)),
        "swin": (hf.SwinForImageClassification, lambda n: hf.SwinConfig(
            image_size=IMAGE_SIZE, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4,
            num_labels=n)),
        "resnet": (hf.ResNetForImageClassification, lambda n: hf.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=n)),
    }  # fmt: skip


NAMES = ("bert", "distilbert", "albert", "roberta", "electra", "vit", "deit", "mobilevit", "convnext", "swin",
         "resnet")  # fmt: skip
TEXT_MODELS = NAMES[:5]


class Logits(nn.Module):
    """A transformers classifier whose forward gives its ``logits`` tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits


def build(kind: str, num_classes: int = 4) -> nn.Module:
    """The ``kind`` model (one of :data:`NAMES`) with ``num_classes`` outputs, random init (seed 0)."""
    cls, config = _configs()[kind]
    torch.manual_seed(0)
    return Logits(cls(config(num_classes)))
