"""Sub-graph extraction (tasks.prepare.onnx_versions.extractor) under both pinned onnx releases: a
TorchScript export has no value_info for its intermediate tensors, and onnx 1.18 (Python 3.12/3.13)
no longer infers it inside ``onnx.utils.Extractor``; the cut of an ONNX-in recipe and the frozen-prefix
split must extract such a graph all the same (it failed with KeyError '/Flatten_output_0' on 3.12)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from tasks.prepare.export.onnx_in import cut
from tasks.prepare.prefix import extract


def _torchscript_export() -> onnx.ModelProto:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, 1, 8, 8),), buf, dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["logits"])  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def test_a_graph_without_value_info_is_cut_and_split_at_an_intermediate_tensor():
    model = _torchscript_export()
    assert not model.graph.value_info  # what made onnx 1.18's Extractor fail
    flat = next(n for n in model.graph.node if n.op_type == "Flatten").output[0]
    x = np.random.default_rng(0).standard_normal((1, 1, 8, 8)).astype(np.float32)
    with_flat = onnx.ModelProto()
    with_flat.CopyFrom(model)
    with_flat.graph.output.append(onnx.helper.make_tensor_value_info(flat, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(with_flat.SerializeToString(), providers=["CPUExecutionProvider"])
    features = session.run([flat], {"input": x})[0]

    head_off = cut(model, (flat,))
    assert [o.name for o in head_off.graph.output] == [flat]
    assert head_off.ir_version == model.ir_version
    np.testing.assert_array_equal(_run(head_off, x), features)

    prefix = extract(model, ["input"], [flat])
    assert [o.name for o in prefix.graph.output] == [flat]
    assert prefix.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 4 * 6 * 6  # shapes inferred
    np.testing.assert_array_equal(_run(prefix, x), features)
