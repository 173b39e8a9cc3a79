"""Models nobody tuned for, made in the tests: a hand-written CNN whose frozen BatchNorm meets
``F.avg_pool2d(x, 4)``, and a foreign ONNX file whose exporter shares one initializer across the
prefix/suffix cut: three
conv + BatchNorm blocks at their initial statistics, exported in eval mode, so the folded zero
biases are one tensor, which each conv reads directly (as a graph optimizer's merge of equal
tensors leaves it: the exporter's own ``Identity`` per conv is bypassed); and an ONNX-in recipe for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from tasks.prepare.graph import bypass

RECIPE = """
name = "foreign-shared"
task = "classification"
[model]
onnx = "foreign.onnx"
cut_at = ["/ReduceMean_output_0"]
input_shape = [1, 8, 8]
input_names = ["input"]
output_names = ["logits"]
[head]
num_classes = 4
[trainable]
train_from = "/f/f.6/Conv"
[loss]
kind = "cross-entropy"
[optimizer]
kind = "adamw"
lr = 1e-2
[training]
batch_size = 8
epochs = 2
[data]
train = "train.npz"
test = "test.npz"
"""


def _blocks() -> nn.Module:
    layers: list[nn.Module] = []
    for cin in (1, 16, 16):
        layers += [nn.Conv2d(cin, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    return nn.Sequential(*layers)


class Foreign(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = _blocks()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.f(x).mean((2, 3)))


def write_foreign(folder: Path, runtime: str = "ort-training") -> Path:
    """Write foreign.onnx, train/test data and recipe.toml (``training.runtime`` = ``runtime``) into
    ``folder``; return the recipe path."""
    torch.manual_seed(0)
    path = folder / "foreign.onnx"
    torch.onnx.export(Foreign().eval(), (torch.randn(1, 1, 8, 8),), str(path), dynamo=False,
                      opset_version=17, input_names=["input"], output_names=["out"])  # fmt: skip
    model = onnx.load(
        str(path)
    )  # the convs read the one bias directly, as a graph optimizer's merge leaves it
    inits = {i.name for i in model.graph.initializer}
    bypass(model, lambda n: n.op_type == "Identity" and n.input[0] in inits)
    onnx.save(model, str(path))
    rng = np.random.default_rng(0)
    for name, n in (("train", 64), ("test", 32)):
        x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
        np.savez(
            folder / f"{name}.npz",
            x=x,
            y=(x[:, 0, :4].mean((1, 2)) > 0).astype(np.int64) * 2 + (x[:, 0, 4:].mean((1, 2)) > 0),
        )
    (folder / "recipe.toml").write_text(
        RECIPE.replace("[training]\n", f'[training]\nruntime = "{runtime}"\n')
    )
    return folder / "recipe.toml"


def shared_initializers(path: Path) -> set[str]:
    """Initializers more than one node reads (directly or through Identity nodes)."""
    graph = onnx.load(str(path)).graph
    reads: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            reads[name] = reads.get(name, 0) + 1
    return {i.name for i in graph.initializer if reads.get(i.name, 0) > 1}


AVGPOOL_MODULE = '''
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """The hand-written CIFAR-style tail: conv + BatchNorm + ReLU, then F.avg_pool2d(x, 4)."""

    def __init__(self, num_classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.linear = nn.Linear(16, num_classes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = F.avg_pool2d(out, 4)
        return self.linear(out.view(out.size(0), -1))


def net(num_classes=4):
    return Net(num_classes)


def make(out_dir):
    rng = np.random.default_rng(0)
    for name, n in (("train", 256), ("test", 96)):
        x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
        y = (x[:, 0, :4].mean((1, 2)) > 0).astype(np.int64) * 2 + (x[:, 0, 4:].mean((1, 2)) > 0)
        x[:, 0, :4] += 0.5 * (y[:, None, None] // 2) - 0.25
        np.savez(out_dir / f"{name}.npz", x=x, y=y)
'''

AVGPOOL_RECIPE = """
name = "avgpool-frozen-bn"
task = "classification"
[model]
callable = "avgpool_net:net"
num_classes = 4
input_shape = [1, 8, 8]
[trainable]
strategy = "last-conv+classifier"
[loss]
kind = "cross-entropy"
[optimizer]
kind = "adamw"
lr = 1e-2
[training]
batch_size = 16
epochs = 3
[data]
make = "avgpool_net:make"
train = "data/train.npz"
test = "data/test.npz"
"""


def write_avgpool(folder: Path, runtime: str = "ort-training") -> Path:
    """Write the conv + BN + ``F.avg_pool2d(x, 4)`` model module and its recipe (``training.runtime``
    = ``runtime``) into ``folder``."""
    (folder / "avgpool_net.py").write_text(AVGPOOL_MODULE)
    (folder / "data").mkdir(exist_ok=True)
    (folder / "recipe.toml").write_text(
        AVGPOOL_RECIPE.replace("[training]\n", f'[training]\nruntime = "{runtime}"\n')
    )
    return folder / "recipe.toml"
