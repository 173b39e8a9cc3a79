"""The inference template: every parameter and buffer of the model is an initializer of its own name
(a fresh BatchNorm's running statistics equal its weight and bias, which the exporter would otherwise
merge), and writing weights at the found offsets is the same file as rewriting the initializers."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from tasks.prepare.runtimes.autograd.template import export_inference, locate, patched


class Fresh(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 3, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(3)  # weight = running_var = 1, bias = running_mean = 0
        self.fc = torch.nn.Linear(3, 2)
        torch.nn.init.zeros_(self.fc.bias)  # equal to bn.bias and bn.running_mean as well

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def _exported(tmp_path) -> onnx.ModelProto:
    path = tmp_path / "model.onnx"
    export_inference(Fresh(), (torch.randn(7, 1, 5, 5),), ["input"], ["logits"], path)
    return onnx.load(str(path))


def test_each_tensor_of_the_model_is_its_own_initializer(tmp_path):
    model = _exported(tmp_path)
    inits = {i.name for i in model.graph.initializer}
    state = {k for k, v in Fresh().state_dict().items() if v.dtype == torch.float32}
    assert inits == state
    assert [i.name for i in model.graph.input] == ["input"]
    assert not [n for n in model.graph.node if n.op_type == "Identity" and n.input[0] in inits]


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_patching_the_offsets_is_rewriting_the_initializers(tmp_path_factory, seed):
    model = _exported(tmp_path_factory.mktemp("template"))
    names = ["conv.weight", "bn.weight", "bn.bias", "fc.weight", "fc.bias"]
    data, offsets = locate(model, names, seed=seed)
    rng = np.random.default_rng(seed)
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    weights = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in names}
    rewritten = onnx.load_from_string(data)
    for init in rewritten.graph.initializer:
        if init.name in weights:
            init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
    assert patched(data, offsets, weights) == rewritten.SerializeToString()
