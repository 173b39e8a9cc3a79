"""Parameters the exporter merged: PyTorch's TorchScript exporter stores equal parameters once (every
fresh BatchNorm's weight of ones and bias of zeros, equal conv biases) and feeds each layer the one
initializer through an ``Identity`` named as its own parameter. Preparation gives each its own
initializer again (tasks.prepare.rewrites.param_chains.split_shared_initializers), so a strategy trains the
layers it names and no other: GoogLeNet under 'last-conv+classifier' failed with ORT's "Duplicate
definition of name (conv2.bn.weight_grad)" when the merged one was selected."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from tests.prepare.kit import BASE, TINY_MODELS, merge

BLOCKS = '''
import torch
from torch import nn


class Blocks(nn.Module):
    """``blocks`` conv + BatchNorm + ReLU blocks at their initial values, pooled, then a Linear."""

    def __init__(self, blocks, conv_bias, num_classes):
        super().__init__()
        torch.manual_seed(0)
        layers = []
        for k in range(blocks):
            layers += [nn.Conv2d(1 if k == 0 else 4, 4, 3, padding=1, bias=conv_bias), nn.BatchNorm2d(4), nn.ReLU()]
        self.f = nn.Sequential(*layers)
        if conv_bias:  # equal biases, as a fresh model's zero ones are
            for m in self.f:
                if isinstance(m, nn.Conv2d):
                    nn.init.zeros_(m.bias)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x):
        return self.fc(self.f(x).mean((2, 3)))


def blocks(num_classes=3, blocks=2, conv_bias=False):
    return Blocks(blocks, conv_bias, num_classes)
'''


def _prepare(tmp_path, blocks: int, conv_bias: bool, strategy: str):
    from tasks.prepare.pipeline import prepare
    from tasks.recipe.load import parse_recipe

    (tmp_path / "tinymodels.py").write_text(TINY_MODELS)
    (tmp_path / "blocksmodel.py").write_text(BLOCKS)
    raw = merge(BASE, {"model": {"callable": "blocksmodel:blocks", "kwargs": {"blocks": blocks, "conv_bias": conv_bias}},
                       "trainable": {"strategy": strategy}})  # fmt: skip
    return prepare(parse_recipe(raw, tmp_path / "recipe.toml"), tmp_path / "out")


def _values(path) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    blocks=st.integers(2, 4),
    conv_bias=st.booleans(),
    strategy=st.sampled_from(["last-conv+classifier", "all"]),
)
@example(blocks=2, conv_bias=False, strategy="last-conv+classifier")  # GoogLeNet's case, shrunk
def test_merged_parameters_train_apart_under_their_own_names(tmp_path_factory, blocks, conv_bias, strategy):
    tmp_path = tmp_path_factory.mktemp("merged")
    done = _prepare(tmp_path, blocks, conv_bias, strategy)
    last = 3 * (blocks - 1)  # the index of the last conv in f
    names = {f"f.{3 * k}.weight" for k in range(blocks)} | {
        f"f.{3 * k + 1}.{p}" for k in range(blocks) for p in ("weight", "bias")
    }
    names |= {f"f.{3 * k}.bias" for k in range(blocks) if conv_bias} | {"fc.weight", "fc.bias"}  # fmt: skip
    trainable = set(done.manifest["trainable"])
    assert trainable <= names, trainable - names  # PyTorch's own names, none merged
    if strategy == "last-conv+classifier":
        want = {f"f.{last}.weight", f"f.{last + 1}.weight", f"f.{last + 1}.bias", "fc.weight", "fc.bias"}
        assert trainable == want | ({f"f.{last}.bias"} if conv_bias else set())
    else:
        assert trainable == names
    prepared = onnx.load(str(done.model_onnx))
    inits = {i.name for i in prepared.graph.initializer}
    assert not [n.name for n in prepared.graph.node if n.op_type == "Identity" and n.input[0] in inits]
    before, after = _values(done.model_onnx), _values(done.out_dir / "validation_inference.onnx")
    assert done.validation["passed"]
    assert np.abs(after[f"f.{last + 1}.weight"] - before[f"f.{last + 1}.weight"]).max() > 0  # trained
    if strategy == "all":  # the first BatchNorm trains too, apart from the last one it equalled
        assert not np.array_equal(after["f.1.weight"], after[f"f.{last + 1}.weight"])
    else:  # the first block stays (its frozen BatchNorm is folded into a scale and a shift)
        np.testing.assert_array_equal(after["f.0.weight"], before["f.0.weight"])
        assert "f.1.weight" not in after


def test_split_keeps_what_the_graph_computes():
    """Three convs reading one zero bias through Identities: split, each has its own bias, the
    merged one is gone, and the graph computes the same."""
    from tasks.prepare.graph import quiet_session
    from tasks.prepare.rewrites.param_chains import split_shared_initializers

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [numpy_helper.from_array(np.full(4, 0.5, np.float32), "merged")], "input"
    for k in range(3):
        w = numpy_helper.from_array(
            rng.normal(size=(4, 1 if k == 0 else 4, 3, 3)).astype(np.float32), f"w{k}"
        )
        inits.append(w)
        nodes += [helper.make_node("Identity", ["merged"], [f"conv{k}.bias"], name=f"Identity_{k}"),
                  helper.make_node("Conv", [x, f"w{k}", f"conv{k}.bias"], [f"c{k}"], pads=[1, 1, 1, 1])]  # fmt: skip
        x = f"c{k}"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [1, 4, 4, 4])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    split = onnx.ModelProto()
    split.CopyFrom(model)
    assert split_shared_initializers(split) == 3
    assert sorted(i.name for i in split.graph.initializer) == [
        "conv0.bias",
        "conv1.bias",
        "conv2.bias",
        "w0",
        "w1",
        "w2",
    ]
    onnx.checker.check_model(split, full_check=True)
    feed = {"input": rng.normal(size=(1, 1, 4, 4)).astype(np.float32)}
    np.testing.assert_array_equal(
        quiet_session(split).run(None, feed)[0], quiet_session(model).run(None, feed)[0]
    )
