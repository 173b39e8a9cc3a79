"""The inference template: every parameter and buffer of the model is an initializer of its own name
(a fresh BatchNorm's running statistics equal its weight and bias, which the exporter would otherwise
merge), the model with some initializers left out and appended again as the board appends them is
the model with those values, and a template whose export holds If nodes (a shape-computed ``tile``,
as SAM2's Hiera window embedding) keeps what their branches read from outside."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from device_agent.runtimes.weights import STATE, assembled
from tasks.prepare.runtimes.autograd.shared import graph_entries, raw_offsets
from tasks.prepare.runtimes.autograd.template import export_inference, write_template


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


NAMES = ["conv.weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "fc.weight", "fc.bias"]


@settings(max_examples=20, deadline=None)
@given(left=st.sets(st.sampled_from(NAMES), min_size=1), by_range=st.sets(st.sampled_from(NAMES)),
       nodes=st.sets(st.integers(0, 20)), seed=st.integers(0, 2**31 - 1))  # fmt: skip
def test_what_a_file_leaves_out_appended_as_the_board_appends_it_is_the_model(tmp_path_factory, left, by_range,
                                                                              nodes, seed):  # fmt: skip
    """Initializers left out (as tensors from the state, or as byte ranges of another file) and
    nodes left out (ranges) come back: the same tensors, the same outputs."""
    folder = tmp_path_factory.mktemp("template")
    model = _exported(folder)
    rng = np.random.default_rng(seed)
    weights = {i.name: rng.standard_normal(tuple(i.dims)).astype(np.float32) for i in model.graph.initializer}
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
    data = model.SerializeToString()
    (folder / "whole.onnx").write_bytes(data)
    for init, (offset, length) in zip(model.graph.initializer, raw_offsets(data), strict=True):
        assert data[offset : offset + length] == init.raw_data  # where the board reads a tensor's data
    entries, inits, count = graph_entries(data), list(model.graph.initializer), len(model.graph.node)
    spans = [(start, end) for (number, start, _, end), i in zip(entries, _indices(entries), strict=True)
             if (number == 1 and i in nodes and i < count) or (number == 5 and inits[i].name in left & by_range)]  # fmt: skip
    table = {"ranges": [["whole", start, end - start] for start, end in spans],
             "tensors": [[n, onnx.TensorProto.FLOAT, list(weights[n].shape), STATE, 0, weights[n].nbytes]
                         for n in sorted(left - by_range)]}  # fmt: skip
    kept = [i for i in model.graph.initializer if i.name not in left]
    kept_nodes = [n for k, n in enumerate(model.graph.node) if k not in nodes]
    del model.graph.initializer[:], model.graph.node[:]
    model.graph.initializer.extend(kept)
    model.graph.node.extend(kept_nodes)
    (folder / "part.onnx").write_bytes(model.SerializeToString())
    joined = assembled(folder / "part.onnx", table, {"whole": folder / "whole.onnx"}, weights)
    got = {i.name: numpy_helper.to_array(i) for i in onnx.load_from_string(joined).graph.initializer}
    assert got.keys() == weights.keys() and all(np.array_equal(got[n], w) for n, w in weights.items())
    x = rng.standard_normal((2, 1, 5, 5)).astype(np.float32)
    (want,) = onnxruntime.InferenceSession(data).run(None, {"input": x})
    (out,) = onnxruntime.InferenceSession(joined).run(None, {"input": x})  # its nodes sorted by ONNX Runtime
    np.testing.assert_array_equal(out, want)


def _indices(entries):
    """Each entry's index among the entries of its kind (nodes, initializers)."""
    seen = {1: 0, 5: 0}
    for number, *_ in entries:
        yield seen[number]
        seen[number] += 1


def test_a_template_with_if_nodes_keeps_what_their_branches_read(tmp_path):
    model, x = Tiled().eval(), torch.randn(3, 1, 4, 4)
    export_inference(model, (torch.randn(7, 1, 4, 4),), ["input"], ["logits", "map"], tmp_path / "m.onnx")
    exported = onnx.load(str(tmp_path / "m.onnx"))
    assert any(n.op_type == "If" for n in exported.graph.node)
    write_template(exported, ["logits"], ["conv.weight", "window", "fc.weight"], tmp_path / "t.onnx")
    (got,) = onnxruntime.InferenceSession(str(tmp_path / "t.onnx")).run(None, {"input": x.numpy()})
    np.testing.assert_allclose(got, model(x)[0].detach().numpy(), rtol=1e-5, atol=1e-6)
