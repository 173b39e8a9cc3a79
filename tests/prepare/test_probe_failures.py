"""The training probe's failures without a pipeline-made message, each one specific line: no CPU
kernel for a gradient (named with its forward node and layer), and a probe killed by a signal
(named with the signal and the check it was running, never an empty reason)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasks.errors import ValidationFailed
from tasks.prepare.pipeline import prepare
from tasks.prepare.sandbox.probe_failures import crash_check, forward_node
from tasks.prepare.validation.validate import FROZEN_BN_HINT
from tests.corpus.generator import UNSPECIFIC
from tests.prepare.kit import merge, tiny_recipe

VOLUME_MODULE = """
import torch
from torch import nn


class Volume(nn.Module):
    # a 3-D transposed convolution: ORT 1.19.2 has no CPU ConvTransposeGrad, and the pipeline's
    # rewrite covers the 2-D case only
    def __init__(self, num_classes=3):
        super().__init__()
        self.conv = nn.Conv3d(1, 2, 3, padding=1)
        self.up = nn.ConvTranspose3d(2, 2, 2, stride=2)
        self.fc = nn.Linear(2, num_classes)

    def forward(self, x):
        return self.fc(self.up(torch.relu(self.conv(x.unsqueeze(1)))).mean((2, 3, 4)))


def volume(num_classes=3):
    return Volume(num_classes)
"""


@pytest.mark.parametrize("chosen", [{"strategy": "all"}, {"strategy": None, "patterns": ["conv.*"]}])
def test_a_gradient_without_a_cpu_kernel_names_its_layer_and_a_way_out(tmp_path, chosen):
    """The advice to train the classifier is rehearsed (the classifier alone, not beside the
    recipe's patterns) and holds: the node lies before the classifier."""
    recipe = tiny_recipe(tmp_path, merge({"model": {"callable": "volume:volume"}}, {"trainable": chosen}))
    (tmp_path / "volume.py").write_text(VOLUME_MODULE)
    with pytest.raises(ValidationFailed) as err:
        prepare(recipe, tmp_path / "out")
    text = str(err.value)
    assert "no CPU kernel for the gradient of ConvTranspose (node /up/ConvTranspose, layer up)" in text
    assert "trainable.train_from" in text and not UNSPECIFIC.search(text)
    assert "(trainable.train_from, or trainable.strategy = 'classifier')" in text  # rehearsed: it passes
    assert "would not help" not in text


TOKENS_MODULE = """
import numpy as np
import torch
from torch import nn


class Upsampled(nn.Module):
    # int64 ids -> an embedding -> the classifier (Linear) -> a 3-D transposed convolution after it,
    # whose gradient ORT 1.19.2 has no CPU kernel for: freezing what precedes the classifier cannot help
    def __init__(self, num_classes=3):
        super().__init__()
        self.emb = nn.Embedding(12, 8)
        self.head = nn.Linear(8, 16)
        self.up = nn.ConvTranspose3d(2, num_classes, 2, stride=2)

    def forward(self, ids):
        return self.up(self.head(self.emb(ids).mean(1)).view(-1, 2, 2, 2, 2)).mean((2, 3, 4))


def upsampled(num_classes=3):
    return Upsampled(num_classes)


def make(out_dir):
    rng = np.random.default_rng(0)
    for name, n in (("train", 96), ("test", 32)):
        x = rng.integers(0, 12, (n, 5)).astype(np.int64)
        np.savez(out_dir / f"{name}.npz", x=x, y=(x[:, 0] % 3).astype(np.int64))
"""


@pytest.mark.parametrize("strategy", ["all", "classifier"])
def test_advice_that_would_end_in_the_same_stop_is_not_offered(tmp_path, strategy):
    """Issue 46: the stop advised trainable.strategy = 'classifier', which ended in the identical
    stop. Rehearsed first, the override is taken out of the advice and the line says why."""
    (tmp_path / "tokens.py").write_text(TOKENS_MODULE)
    recipe = tiny_recipe(tmp_path, {"model": {"callable": "tokens:upsampled", "input_shape": [5], "input_dtype": "int64"},
                                    "trainable": {"strategy": strategy}, "data": {"make": "tokens:make"}})  # fmt: skip
    with pytest.raises(ValidationFailed) as err:
        prepare(recipe, tmp_path / "out")
    text = str(err.value)
    assert err.value.check == "load_artifacts"
    assert "no CPU kernel for the gradient of ConvTranspose (node /up/ConvTranspose, layer up)" in text
    assert text.endswith("make only parameters after that layer trainable (trainable.train_from) or freeze the layer; "
                         + ("the recipe already has trainable.strategy = 'classifier'" if strategy == "classifier"
                            else "trainable.strategy = 'classifier' would not help (rehearsed: it ends in this same stop)")), text  # fmt: skip
    assert not list(tmp_path.glob("out*")), "a stopped preparation leaves nothing"


def test_a_probe_killed_by_a_signal_says_which_and_where():
    """A real process that dies on SIGFPE after saying it entered the train step, as the probe does."""
    code = (
        "import os, signal, sys; print('odl-probe-stage load_artifacts', file=sys.stderr); "
        "print('odl-probe-stage train_step', file=sys.stderr, flush=True); os.kill(os.getpid(), signal.SIGFPE)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode < 0
    failure = crash_check(proc.returncode, proc.stderr)
    assert failure.check == "train_step"
    assert (
        "killed by SIGFPE (an arithmetic fault: an integer division or remainder by zero) inside ONNX Runtime "
        "during the train step check" in str(failure)
    )
    assert not str(failure).rstrip().endswith(":") and "\n" not in str(failure)
    text = str(failure)  # no layer is known here: the advice names none
    assert "that layer" not in text and "trainable.strategy = 'classifier'" in text


def test_gradient_nodes_map_to_their_forward_node():
    assert forward_node("/layer4/layer4.1/bn2/BatchNormalization/Mul_Grad/Mul_2") == (
        "/layer4/layer4.1/bn2/BatchNormalization/Mul"
    )
    assert forward_node("/tail/Resize_Grad/ResizeGrad_0") == "/tail/Resize"


def _padded_pool_model(path) -> None:
    """A foreign file whose MaxPool pads as much as its kernel: ORT refuses it at initialisation."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 1, 3, 3)).astype(np.float32), "conv.w"
    )
    nodes = [
        helper.make_node("Conv", ["input", "conv.w"], ["c"], name="/features/conv/Conv", pads=[1, 1, 1, 1]),
        helper.make_node(
            "MaxPool", ["c"], ["p"], name="/features/pool/MaxPool", kernel_shape=[2, 2], pads=[2, 2, 2, 2]
        ),
        helper.make_node("ReduceMean", ["p"], ["feat"], name="/pool/ReduceMean", axes=[2, 3], keepdims=0),
    ]
    graph = helper.make_graph(nodes, "foreign", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 4])], [w])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_an_initialisation_error_names_its_node_and_layer(tmp_path):
    from tasks.errors import ModelError

    _padded_pool_model(tmp_path / "foreign.onnx")
    recipe = tiny_recipe(tmp_path, {"model": {"callable": None, "onnx": "foreign.onnx", "cut_at": ["feat"],
                                              "output_names": ["logits"]}, "head": {"num_classes": 3}})  # fmt: skip
    with pytest.raises(ModelError) as err:
        prepare(recipe, tmp_path / "out")
    text = str(err.value)
    assert "cannot initialise node '/features/pool/MaxPool' (MaxPool, layer features.pool)" in text
    assert "Pad should be smaller than kernel" in text and not UNSPECIFIC.search(text)


@pytest.mark.parametrize(
    ("line", "offered"),
    [
        ("repeating one batch 12 times from the base weights, the loss stayed flat" + FROZEN_BN_HINT,
         ["trainable.batchnorm = 'batch-stats'"]),
        ("Erf is not supported by training.runtime = 'autograd' yet (train fewer layers, or use "
         "training.runtime = 'ort-training')", ["training.runtime = 'ort-training'"]),
    ],
)  # fmt: skip
def test_only_the_advice_is_rehearsed_not_what_describes_the_recipe(tmp_path, line, offered):
    """Issue 53: a loss_falls stop said 'with trainable.batchnorm = 'frozen' ... use 'batch-stats''
    and the rehearsal re-prepared with 'frozen' (the recipe's default), then appended 'would not
    help'. A ``key = 'value'`` the recipe already holds, given or by default, and not offered as an
    option describes the recipe: neither rehearsed nor taken out; the advice is rehearsed."""
    from tasks.prepare.advice import rehearse

    recipe = tiny_recipe(tmp_path, {"training": {"runtime": None}, "trainable": {"batchnorm": None}})
    assert recipe.trainable.batchnorm == "frozen" and recipe.training.runtime == "autograd"  # by default
    tried = []

    def rerun(changed):
        tried.append(changed)
        raise ValidationFailed("loss_falls", line)  # the same stop: the advice would not help

    stop = ValidationFailed("loss_falls", line)
    rehearse(recipe, stop, rerun)
    assert [(c.trainable.batchnorm, c.training.runtime) for c in tried] == [
        (
            "batch-stats" if "batch" in offered[0] else "frozen",
            "ort-training" if "ort" in offered[0] else "autograd",
        )
    ]
    assert str(stop).endswith(f"; {offered[0]} would not help (rehearsed: it ends in this same stop)"), stop
    assert "frozen" not in str(stop).split(";")[-1] and "'autograd' would not help" not in str(stop)
