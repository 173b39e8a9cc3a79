"""The autograd runtime's losses are the ORT path's: each built-in loss and the distillation loss, in
PyTorch, give the loss and the gradient ONNX Runtime's training graph gives with that loss block, on
a model whose output is ``x * w`` (``w`` trainable)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tasks.prepare.losses.distillation import distillation_loss
from tasks.prepare.runtimes.autograd.losses import builtin, distillation

N, C = 6, 4
TEMPERATURE = 2.5
pytestmark = pytest.mark.ort_training  # each loss is compared with ONNX Runtime's training graph


def _scaled_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, C, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["input", "w"], ["out"])],
        "scaled",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", C])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", C])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ort(tmp_path, loss, x, label):
    """(loss, gradient of w) by ORT's training graph with ``loss``."""
    from onnxruntime.training import api, artifacts

    artifacts.generate_artifacts(_scaled_model(), requires_grad=["w"], frozen_params=[], loss=loss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)  # fmt: skip
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = api.Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    out = module(x, label)
    return float(np.asarray(out[0] if isinstance(out, tuple) else out)), np.array(state.parameters["w"].grad)


def _torch(fn, x, label):
    w = torch.from_numpy(np.linspace(0.5, 1.5, C, dtype=np.float32)).requires_grad_()
    loss = fn(torch.from_numpy(x) * w, torch.from_numpy(label))
    loss.backward()
    return loss.item(), w.grad.numpy()


def _labels(kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "cross-entropy":
        return rng.integers(0, C, N).astype(np.int64)
    if kind == "bce-with-logits":
        return rng.integers(0, 2, (N, C)).astype(np.float32)
    return rng.standard_normal((N, C)).astype(np.float32)


@pytest.mark.parametrize("kind", ["cross-entropy", "mse", "l1", "bce-with-logits"])
def test_builtin_losses_reduce_as_ort_s(tmp_path, kind):
    from onnxruntime.training import artifacts

    names = {
        "mse": "MSELoss",
        "cross-entropy": "CrossEntropyLoss",
        "bce-with-logits": "BCEWithLogitsLoss",
        "l1": "L1Loss",
    }
    rng = np.random.default_rng(0)
    x, label = rng.standard_normal((N, C)).astype(np.float32), _labels(kind, rng)
    want_loss, want_grad = _ort(tmp_path, getattr(artifacts.LossType, names[kind]), x, label)
    got_loss, got_grad = _torch(lambda out, lab: builtin(kind, out, lab), x, label)
    assert abs(got_loss - want_loss) <= 1e-6 * max(1.0, abs(want_loss))
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-7)


def test_distillation_is_the_ort_path_s_block(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, C)).astype(np.float32)
    target = torch.softmax(
        torch.from_numpy(rng.standard_normal((N, C)).astype(np.float32)) / TEMPERATURE, -1
    ).numpy()
    want_loss, want_grad = _ort(tmp_path, distillation_loss(TEMPERATURE), x, target)
    got_loss, got_grad = _torch(lambda out, lab: distillation(out, lab, TEMPERATURE), x, target)
    assert abs(got_loss - want_loss) <= 1e-6 * max(1.0, abs(want_loss))
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-7)
