"""The keypoints loss as ORT trains it: the generated graphs make Gaussian targets from labels
[N, K, 3] inside the graph and compute the host's numpy loss (heatmaps at a stride, coordinates),
unlabelled keypoints count for nothing, training lowers it, and a wrong output shape is one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.errors import RecipeError
from tasks.judge.keypoints import keypoint_losses
from tasks.prepare.losses.keypoints import keypoints_loss, output_kind

K, SIDE, HEAT = 3, 8, 4  # keypoints, input side, heatmap side (stride 2)


def _model(kind: str) -> onnx.ModelProto:
    """input [batch, 2, SIDE, SIDE] -> heatmaps [batch, K, HEAT, HEAT] (a stride-2 conv) or
    coordinates [batch, K, 2] (a linear layer)."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 2, SIDE, SIDE])
    if kind == "heatmaps":
        w = numpy_helper.from_array(rng.normal(0, 0.3, (K, 2, 2, 2)).astype(np.float32), "w")
        nodes = [helper.make_node("Conv", ["input", "w"], ["out"], strides=[2, 2])]
        out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", K, HEAT, HEAT])
    else:
        w = numpy_helper.from_array(rng.normal(0, 0.3, (2 * SIDE * SIDE, K * 2)).astype(np.float32), "w")
        shapes = [
            numpy_helper.from_array(np.array(a, np.int64), n)
            for a, n in (([0, -1], "flat"), ([0, K, 2], "kp"))
        ]
        nodes = [helper.make_node("Reshape", ["input", "flat"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["m"]),
                 helper.make_node("Reshape", ["m", "kp"], ["out"])]  # fmt: skip
        out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", K, 2])
        graph = helper.make_graph(nodes, "kp", [x], [out], [w, *shapes])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    graph = helper.make_graph(nodes, "kp", [x], [out], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture(scope="module", params=["heatmaps", "coordinates"])
def trained(request, tmp_path_factory):
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    kind, out = request.param, tmp_path_factory.mktemp(request.param)
    dims = ["batch", K, HEAT, HEAT] if kind == "heatmaps" else ["batch", K, 2]
    artifacts.generate_artifacts(_model(kind), requires_grad=["w"], loss=keypoints_loss(K, (SIDE, SIDE), 1.5, dims),
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=out,
                                 additional_output_names=["out"])  # fmt: skip
    state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
    module = Module(str(out / "training_model.onnx"), state, str(out / "eval_model.onnx"))
    return kind, module, Optimizer(str(out / "optimizer_model.onnx"), module), out


def _batch(seed: int, n: int = 6):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, 2, SIDE, SIDE)).astype(np.float32)
    y = np.zeros((n, K, 3), np.float32)
    y[..., :2] = rng.uniform(0, SIDE, (n, K, 2))
    y[..., 2] = rng.choice([0.0, 1.0, 2.0], (n, K), p=[0.3, 0.2, 0.5])
    return x, y


def test_the_graph_computes_the_hosts_loss(trained):
    kind, module, _, out = trained
    labels = next(i for i in onnx.load(str(out / "training_model.onnx")).graph.input if i.name == "labels")
    assert [d.dim_value or d.dim_param for d in labels.type.tensor_type.shape.dim] == ["batch", K, 3]
    module.eval()
    for seed in range(3):
        x, y = _batch(seed)
        loss, pred = module(x, y)
        want, per_image = keypoint_losses(pred, y, (SIDE, SIDE), 1.5)
        assert float(np.asarray(loss).item()) == pytest.approx(want, rel=1e-5, abs=1e-7)
        assert per_image.mean() == pytest.approx(want, rel=1e-9)


def test_an_unlabelled_keypoint_counts_for_nothing(trained):
    _, module, _, _ = trained
    module.eval()
    x, y = _batch(7)
    y[0, 0, 2] = 0.0
    moved = y.copy()
    moved[0, 0, :2] += 3.0  # where an unlabelled keypoint is said to be does not matter
    assert np.asarray(module(x, y)[0]).item() == pytest.approx(
        np.asarray(module(x, moved)[0]).item(), rel=1e-7
    )


def test_training_lowers_the_loss(trained):
    _, module, optimizer, _ = trained
    x, y = _batch(11, 16)
    module.train()
    first = np.asarray(module(x, y)[0]).item()
    for _ in range(40):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    assert np.asarray(module(x, y)[0]).item() < 0.9 * first


def test_an_output_of_another_shape_is_one_line():
    with pytest.raises(RecipeError) as err:
        output_kind(["batch", 4, 16, 16], "scores", 5)
    assert str(err.value).count("\n") == 0
    assert "loss.kind" in str(err.value) and "[batch, K=5, H, W]" in str(err.value)
    assert "output 'scores' has shape [batch, 4, 16, 16]" in str(err.value)
