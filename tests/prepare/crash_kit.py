"""A model whose own loss kills ONNX Runtime on made-up labels, and the smallest graph doing the same.

Like an SSD multibox loss, :data:`CRASH_MODELS`'s ``CountedLoss`` scores every cell of a 4x4 map
(background 0 or one of two classes) and normalises its loss by an integer count of positive cells:
real data, where every sample has at least one object, never divides by 0; all-zero labels do,
and ONNX Runtime 1.19.2 dies with SIGFPE on an int64 Div by 0 (it does not raise).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.prepare.kit import merge

CRASH_MODELS = """
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class CountedLoss(nn.Module):
    def __init__(self, num_classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.cls = nn.Conv2d(4, num_classes, 1)

    def forward(self, x, labels):
        logits = self.cls(torch.relu(self.conv(x))).flatten(2).transpose(1, 2)  # [N, 16 cells, classes]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        positives = (labels > 0).sum()
        cells_per_positive = labels.numel() // positives  # an integer count: 0 positives divide by 0
        return ce.mean() * cells_per_positive, logits


def counted_loss(num_classes=3):
    return CountedLoss(num_classes)


def labels_of(x):
    # every sample has objects: its 2 brightest cells, class 1 or 2 by sign of the mean
    flat = x.reshape(len(x), -1)
    labels = np.zeros(flat.shape, np.int64)
    top = np.argsort(-flat, axis=1)[:, :2]
    np.put_along_axis(labels, top, np.where(flat.mean(1, keepdims=True) > 0, 1, 2), axis=1)
    return labels


def make(out_dir):
    rng = np.random.default_rng(0)
    for name, n in (("train", 64), ("test", 32)):
        x = rng.standard_normal((n, 1, 4, 4)).astype(np.float32)
        np.savez(out_dir / f"{name}.npz", x=x, y=labels_of(x))


def make_empty_batch(out_dir):
    # the second batch of 16 training samples has no object at all: the board would divide by 0
    make(out_dir)
    with np.load(out_dir / "train.npz") as npz:
        x, y = npz["x"], npz["y"].copy()
    y[16:32] = 0
    np.savez(out_dir / "train.npz", x=x, y=y)


def make_empty_board_batch(out_dir):
    # the board's 3rd batch of its 2nd epoch (its shuffle of seed 0, 16 samples a batch, the 7th step)
    # has no object: rows in order, and every batch of its first epoch, hold some
    from device_agent.data.readers import epoch_permutation

    make(out_dir)
    with np.load(out_dir / "train.npz") as npz:
        x, y = npz["x"], npz["y"].copy()
    y[epoch_permutation(0, 1, len(y))[32:48]] = 0
    np.savez(out_dir / "train.npz", x=x, y=y)
"""

RECIPE = {
    "task": "embedded",
    "model": {"callable": "crashmodels:counted_loss", "num_classes": 3, "input_names": ["x", "labels"],
              "output_names": ["loss", "logits"]},
    "trainable": {"strategy": "all"},
    "loss": {"kind": "embedded"},
    "data": {"make": "crashmodels:make", "feeds": {"x": "x", "labels": "y"}},
}  # fmt: skip


EMPTY_BOARD_BATCH = {"training": {"epochs": 2}, "data": {"make": "crashmodels:make_empty_board_batch"}}
EMPTY_BOARD_STEP = 7  # the step of the board's batch make_empty_board_batch empties (2nd epoch, 3rd batch)


def crash_recipe(folder: Path, changes: dict | None = None) -> dict:
    """The tiny recipe's changes for ``CountedLoss`` (``changes`` merged in), its module written to ``folder``."""
    (folder / "crashmodels.py").write_text(CRASH_MODELS)
    return merge(RECIPE, changes or {})


def counting_div_graph() -> onnx.ModelProto:
    """``sum(x) // count(labels > 0)`` in int64: the smallest graph ORT 1.19.2 dies on (SIGFPE)
    when no label is positive."""
    nodes = [
        helper.make_node("Greater", ["labels", "zero"], ["positive"], name="/loss/Greater"),
        helper.make_node("Cast", ["positive"], ["positive_i"], name="/loss/Cast", to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["positive_i"], ["count"], name="/loss/ReduceSum", keepdims=0),
        helper.make_node("ReduceSum", ["x"], ["total"], name="/head/ReduceSum", keepdims=0),
        helper.make_node("Cast", ["total"], ["total_i"], name="/head/Cast", to=TensorProto.INT64),
        helper.make_node("Div", ["total_i", "count"], ["ratio"], name="/loss/Div"),
    ]
    graph = helper.make_graph(
        nodes, "counting",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch", 4])],
        [helper.make_tensor_value_info("ratio", TensorProto.INT64, [])],
        [onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
