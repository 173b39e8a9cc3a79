"""The autograd runtime's segmentation and keypoints losses are the ORT path's: in PyTorch they give
the loss and the gradient that ONNX Runtime's training graph gives with the ORT path's loss block,
on a model whose output is ``input * w`` (``w`` trainable, the output's shape without the batch, so
its gradient holds every output element's), with ignored pixels, a class no label has, and
keypoints that are not labelled."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tasks.prepare.losses.keypoints import keypoints_loss
from tasks.prepare.losses.segmentation import segmentation_loss
from tasks.prepare.runtimes.autograd.task_losses import keypoints, segmentation

N, C, SIDE = 3, 4, 5  # segmentation: batch, classes (the last one in no label), side
K, INPUT, HEAT = 3, 8, 4  # keypoints: count, input side, heatmap side (stride 2)
TOLERANCE = 1e-5
pytestmark = pytest.mark.ort_training  # each loss is compared with ONNX Runtime's training graph


def _scaled(shape: list[int]) -> onnx.ModelProto:
    """input [batch, *shape] -> out = input * w, w [*shape] trainable."""
    w = numpy_helper.from_array(
        np.linspace(0.5, 1.5, int(np.prod(shape)), dtype=np.float32).reshape(shape), "w"
    )
    graph = helper.make_graph(
        [helper.make_node("Mul", ["input", "w"], ["out"])],
        "scaled",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *shape])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", *shape])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _ort(tmp_path, shape, block, x, labels):
    """(loss, gradient of w) by ORT's training graph with the loss ``block``."""
    from onnxruntime.training import api, artifacts

    artifacts.generate_artifacts(_scaled(shape), requires_grad=["w"], frozen_params=[], loss=block,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)  # fmt: skip
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = api.Module(str(tmp_path / "training_model.onnx"), state, str(tmp_path / "eval_model.onnx"))
    out = module(x, labels)
    return float(np.asarray(out[0] if isinstance(out, tuple) else out)), np.array(state.parameters["w"].grad)


def _torch(shape, fn, x, labels):
    """(loss, gradient of w) of ``fn(input * w, labels)`` by PyTorch's autograd."""
    w = torch.from_numpy(np.linspace(0.5, 1.5, int(np.prod(shape)), dtype=np.float32).reshape(shape))
    w.requires_grad_()
    loss = fn(torch.from_numpy(x) * w, torch.from_numpy(labels))
    loss.backward()
    return loss.item(), w.grad.numpy()


def _compare(tmp_path, shape, block, fn, x, labels) -> tuple[float, float]:
    want_loss, want_grad = _ort(tmp_path, shape, block, x, labels)
    got_loss, got_grad = _torch(shape, fn, x, labels)
    loss_diff, grad_diff = abs(got_loss - want_loss), float(np.abs(got_grad - want_grad).max())
    print(f"loss {want_loss:.6f}: |diff| {loss_diff:.2e}; gradient max |diff| {grad_diff:.2e} "
          f"(max |grad| {np.abs(want_grad).max():.3e})")  # fmt: skip
    assert np.isfinite(want_loss) and np.abs(want_grad).max() > 0
    assert loss_diff <= TOLERANCE * max(1.0, abs(want_loss))
    np.testing.assert_allclose(got_grad, want_grad, rtol=TOLERANCE, atol=TOLERANCE)
    return loss_diff, grad_diff


@pytest.mark.parametrize(
    ("kind", "ignore", "ignored"),
    [("cross-entropy", 255, 0.2), ("dice", 255, 0.3), ("cross-entropy+dice", -100, 0.2), ("dice", 255, 0.0)],
)
def test_segmentation_losses_are_the_ort_blocks(tmp_path, kind, ignore, ignored):
    rng = np.random.default_rng(len(kind) + int(ignored * 10))
    x = rng.normal(0, 2, (N, C, SIDE, SIDE)).astype(np.float32)
    y = rng.integers(0, C - 1, (N, SIDE, SIDE)).astype(np.int64)  # class C - 1 in no label
    y[rng.uniform(size=y.shape) < ignored] = ignore
    assert (y == ignore).any() == (ignored > 0)
    block = segmentation_loss(kind, C, ignore, dice_weight=0.5, dims=["batch", C, SIDE, SIDE])
    _compare(tmp_path, [C, SIDE, SIDE], block, lambda o, t: segmentation(kind, o, t, ignore, 0.5), x, y)


@pytest.mark.parametrize("output", ["heatmaps", "coordinates"])
def test_keypoints_losses_are_the_ort_block(tmp_path, output):
    rng = np.random.default_rng(7)
    shape = [K, HEAT, HEAT] if output == "heatmaps" else [K, 2]
    x = rng.uniform(0, 1 if output == "heatmaps" else INPUT, (N, *shape)).astype(np.float32)
    y = np.zeros((N, K, 3), np.float32)
    y[..., :2] = rng.uniform(0, INPUT, (N, K, 2))
    y[..., 2] = [[2, 0, 1], [0, 2, 2], [1, 1, 0]]  # some keypoints not labelled
    block = keypoints_loss(K, (INPUT, INPUT), 1.5, ["batch", *shape])
    _compare(tmp_path, shape, block, lambda o, t: keypoints(o, t, (INPUT, INPUT), 1.5), x, y)
