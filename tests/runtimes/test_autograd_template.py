"""The inference template: every parameter and buffer of the model is an initializer of its own name
(a fresh BatchNorm's running statistics equal its weight and bias, which the exporter would otherwise
merge), writing weights at the found offsets is the same file as rewriting the initializers, and a
template whose export holds If nodes (a shape-computed ``tile``, as SAM2's Hiera window embedding)
keeps what their branches read from outside."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from tasks.prepare.runtimes.autograd.template import export_inference, locate, patched, write_template


class Fresh(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 3, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(3)  # weight = running_var = 1, bias = running_mean = 0
        self.fc = torch.nn.Linear(3, 2)
        torch.nn.init.zeros_(self.fc.bias)  # equal to bn.bias and bn.running_mean as well

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


class Tiled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.window = torch.nn.Parameter(torch.randn(1, 4, 2, 2))
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)  # the tile's repeats are traced sizes: the exporter writes Ifs on their count
        y = y + self.window.tile((y.shape[-2] // 2, y.shape[-1] // 2))
        return self.fc(y.mean(dim=(2, 3))), y


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


def test_a_template_with_if_nodes_keeps_what_their_branches_read(tmp_path):
    model, x = Tiled().eval(), torch.randn(3, 1, 4, 4)
    export_inference(model, (torch.randn(7, 1, 4, 4),), ["input"], ["logits", "map"], tmp_path / "m.onnx")
    exported = onnx.load(str(tmp_path / "m.onnx"))
    assert any(n.op_type == "If" for n in exported.graph.node)
    write_template(exported, ["logits"], ["conv.weight", "window", "fc.weight"], tmp_path / "t.onnx")
    (got,) = onnxruntime.InferenceSession(str(tmp_path / "t.onnx")).run(None, {"input": x.numpy()})
    np.testing.assert_allclose(got, model(x)[0].detach().numpy(), rtol=1e-5, atol=1e-6)
